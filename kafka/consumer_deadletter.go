package kafka

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
)

// Headers the consumer adds to a dead-lettered record, besides the
// original headers (the event id among them, under HeaderEventID): package
// idem's spelling, which every adapter shares.
const (
	// HeaderDeadLetterError carries the last handler error, cut to
	// consume.DeadLetterErrorMaxBytes.
	HeaderDeadLetterError = idem.HeaderDeadLetterError
	// HeaderDeadLetterSource is the original "topic/partition/offset".
	HeaderDeadLetterSource = idem.HeaderDeadLetterSource
	// HeaderDeadLetterAttempts is how many times the handler failed.
	HeaderDeadLetterAttempts = idem.HeaderDeadLetterAttempts
	// HeaderDeadLetterConsumer is the ConsumerID that gave up.
	HeaderDeadLetterConsumer = idem.HeaderDeadLetterConsumer
)

// DeadLetter produces a copy of m's record to the dead-letter topic and
// waits for the broker's acknowledgement, or for ctx (the consumer bounds
// each attempt by DeadLetterTimeout and retries; it never drops the
// record). It runs concurrently with Fetch and Ack, which the client
// allows.
func (s *session) DeadLetter(ctx context.Context, m *consume.Message, dl consume.DeadLetter) error {
	rec := m.Raw.(*kgo.Record)
	topic := s.cfg.DeadLetterTopic
	if topic == "" {
		topic = rec.Topic + DeadLetterSuffixDefault
	}
	headers := make([]kgo.RecordHeader, 0, len(rec.Headers)+5)
	headers = append(headers, rec.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderDeadLetterError, Value: []byte(dl.Error)},
		kgo.RecordHeader{Key: HeaderDeadLetterSource, Value: []byte(recordSource(rec))},
		kgo.RecordHeader{Key: HeaderDeadLetterAttempts, Value: []byte(strconv.Itoa(dl.Attempts))},
		kgo.RecordHeader{Key: HeaderDeadLetterConsumer, Value: []byte(dl.ConsumerID)},
	)
	if !hasHeader(rec, HeaderEventID) && m.EventID != "" {
		headers = append(headers, kgo.RecordHeader{Key: HeaderEventID, Value: []byte(m.EventID)})
	}
	dup := &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: headers}
	return s.cl.ProduceSync(ctx, dup).FirstErr()
}

func hasHeader(rec *kgo.Record, key string) bool {
	for _, h := range rec.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}
