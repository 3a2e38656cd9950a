package kafka

import "github.com/idemkit/idem/consume"

// NewDriverForTest is the franz-go driver of cfg (defaults filled), for the
// consumertest kit, which runs consume.Consumer on it directly.
func NewDriverForTest(cfg *ConsumerConfig) (consume.Driver, error) { return NewDriver(cfg) }

// SourceTopicForTest exposes the dlq-source parser to the fuzz test.
func SourceTopicForTest(src string) string { return sourceTopic(src) }
