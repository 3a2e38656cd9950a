package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
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
	// HeaderDeadLetterTruncated is "true" on a reference copy (see
	// session.DeadLetter): no value; the original is at dlq-source.
	HeaderDeadLetterTruncated = idem.HeaderDeadLetterTruncated
	// HeaderDeadLetterSize is a reference copy's original size in bytes.
	HeaderDeadLetterSize = idem.HeaderDeadLetterSize
)

// DeadLetter produces a copy of m's record to the dead-letter topic and
// waits for the broker's acknowledgement, or for ctx (the consumer bounds
// each attempt by DeadLetterTimeout and retries; it never drops the
// record). It runs concurrently with Fetch and Ack, which the client
// allows.
//
// A copy too large for the dead-letter topic or the producer
// (MESSAGE_TOO_LARGE) is replaced by a reference copy: no value, the key
// and the event headers (event-id, event-type, aggregate-type,
// aggregate-seq) when each is at most 1 KiB, the dlq-* headers, and
// dlq-truncated "true" with dlq-size, the original's size. The partition
// moves on; the original stays readable at dlq-source until the source
// topic's retention deletes it (DLQ.Show and DLQ.Redrive read it there).
func (s *session) DeadLetter(ctx context.Context, m *consume.Message, dl consume.DeadLetter) error {
	rec := m.Raw.(*kgo.Record)
	topic := s.cfg.DeadLetterTopic
	if topic == "" {
		topic = rec.Topic + DeadLetterSuffixDefault
	}
	dup := &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: kgoHeaders(dl.CopyHeaders(m, recordSource(rec)))}
	err := s.cl.ProduceSync(ctx, dup).FirstErr()
	if !tooLarge(err) {
		return err
	}
	// The copy is larger than the dead-letter topic (its
	// max.message.bytes) or this producer (kgo.ProducerBatchMaxBytes)
	// accepts, and would be on every attempt: held, the record would stop
	// its partition until an operator raised a limit. Dead-letter a
	// reference instead: where the original is, its size, the error, its
	// event headers, and no value. The original is not lost while the
	// source topic's retention keeps it: idem dlq show reads it from
	// there, and a redrive republishes it from there (or refuses, saying
	// so, once it is gone).
	ref := &kgo.Record{Topic: topic, Key: consume.ReferenceKey(m), Headers: kgoHeaders(dl.ReferenceHeaders(m, recordSource(rec)))}
	if rerr := s.cl.ProduceSync(ctx, ref).FirstErr(); rerr != nil {
		return fmt.Errorf("kafka: dead-letter copy too large (%w), and its reference copy failed: %w", err, rerr)
	}
	s.log.Warn("dead-lettered a reference copy: the record is too large to dead-letter whole; its value stays in the source topic",
		"source", recordSource(rec), "size", consume.MessageSize(m), "dead_letter_topic", topic, "err", err)
	return nil
}

// kgoHeaders converts the shared dead-letter headers to franz-go's.
func kgoHeaders(hs []consume.Header) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return out
}

// tooLarge reports a produce refused for its size: by the broker (the
// topic's max.message.bytes) or locally (the producer's batch limit).
func tooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}
