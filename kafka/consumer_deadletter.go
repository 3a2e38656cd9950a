package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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

// referenceFieldMaxBytes bounds the key and each header a reference copy
// keeps from the original: longer ones are left in the source.
const referenceFieldMaxBytes = 1024

// referenceHeaders are the original's headers a reference copy keeps: the
// event's identity, enough to find and deduplicate it.
var referenceHeaders = map[string]bool{
	HeaderEventID: true, idem.HeaderEventType: true, idem.HeaderAggregateType: true, idem.HeaderAggregateSeq: true,
}

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
	ref := reference(rec, topic, dl, m.EventID)
	if rerr := s.cl.ProduceSync(ctx, ref).FirstErr(); rerr != nil {
		return fmt.Errorf("kafka: dead-letter copy too large (%w), and its reference copy failed: %w", err, rerr)
	}
	s.log.Warn("dead-lettered a reference copy: the record is too large to dead-letter whole; its value stays in the source topic",
		"source", recordSource(rec), "size", recordSize(rec), "dead_letter_topic", topic, "err", err)
	return nil
}

// reference is the reference copy of rec (see DeadLetter).
func reference(rec *kgo.Record, topic string, dl consume.DeadLetter, eventID string) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, len(referenceHeaders)+6)
	for _, h := range rec.Headers {
		if referenceHeaders[h.Key] && len(h.Value) <= referenceFieldMaxBytes {
			headers = append(headers, h)
		}
	}
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderDeadLetterError, Value: []byte(dl.Error)},
		kgo.RecordHeader{Key: HeaderDeadLetterSource, Value: []byte(recordSource(rec))},
		kgo.RecordHeader{Key: HeaderDeadLetterAttempts, Value: []byte(strconv.Itoa(dl.Attempts))},
		kgo.RecordHeader{Key: HeaderDeadLetterConsumer, Value: []byte(dl.ConsumerID)},
		kgo.RecordHeader{Key: HeaderDeadLetterTruncated, Value: []byte("true")},
		kgo.RecordHeader{Key: HeaderDeadLetterSize, Value: []byte(strconv.Itoa(recordSize(rec)))},
	)
	if !hasHeader(rec, HeaderEventID) && eventID != "" && len(eventID) <= referenceFieldMaxBytes {
		headers = append(headers, kgo.RecordHeader{Key: HeaderEventID, Value: []byte(eventID)})
	}
	ref := &kgo.Record{Topic: topic, Headers: headers}
	if len(rec.Key) <= referenceFieldMaxBytes {
		ref.Key = rec.Key // the same partition as the full copy would take
	}
	return ref
}

// tooLarge reports a produce refused for its size: by the broker (the
// topic's max.message.bytes) or locally (the producer's batch limit).
func tooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// recordSize is rec's key, value and headers in bytes.
func recordSize(rec *kgo.Record) int {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func hasHeader(rec *kgo.Record, key string) bool {
	for _, h := range rec.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}
