package consume

import (
	"strconv"

	"github.com/idemkit/idem"
)

// ReferenceFieldMaxBytes bounds the key and each header that a reference
// copy keeps from the original: longer ones are left in the source.
const ReferenceFieldMaxBytes = 1024

// referenceHeaders are the original's headers a reference copy keeps: the
// event's identity, enough to find and deduplicate it.
var referenceHeaders = map[string]bool{
	idem.HeaderEventID: true, idem.HeaderEventType: true, idem.HeaderAggregateType: true, idem.HeaderAggregateSeq: true,
}

// CopyHeaders returns the headers of m's full dead-letter copy: m's own
// headers, then dlq-error, dlq-source (source: where m is on its broker,
// Kafka "topic/partition/offset", NATS "stream/sequence"), dlq-attempts
// and dlq-consumer, and event-id = m.EventID when m has no event-id
// header. Drivers share it, so that every broker's dead letters read the
// same.
func (dl DeadLetter) CopyHeaders(m *Message, source string) []Header {
	out := make([]Header, 0, len(m.Headers)+5)
	out = append(out, m.Headers...)
	out = dl.appendDLQ(out, source)
	if !hasHeader(m.Headers, idem.HeaderEventID) && m.EventID != "" {
		out = append(out, Header{Key: idem.HeaderEventID, Value: []byte(m.EventID)})
	}
	return out
}

// ReferenceHeaders returns the headers of m's reference copy, the copy a
// driver dead-letters instead of the full one when that is too large for
// the dead-letter destination: the event headers of m (event-id,
// event-type, aggregate-type, aggregate-seq) that are at most
// ReferenceFieldMaxBytes each, the dlq-* headers of CopyHeaders, and
// dlq-truncated "true" with dlq-size, m's size (MessageSize). A reference
// copy has no value, and its key is ReferenceKey(m): the original stays
// at source, readable until the source's retention deletes it.
func (dl DeadLetter) ReferenceHeaders(m *Message, source string) []Header {
	out := make([]Header, 0, len(referenceHeaders)+6)
	for _, h := range m.Headers {
		if referenceHeaders[h.Key] && len(h.Value) <= ReferenceFieldMaxBytes {
			out = append(out, h)
		}
	}
	out = dl.appendDLQ(out, source)
	out = append(out,
		Header{Key: idem.HeaderDeadLetterTruncated, Value: []byte("true")},
		Header{Key: idem.HeaderDeadLetterSize, Value: []byte(strconv.Itoa(MessageSize(m)))},
	)
	if !hasHeader(m.Headers, idem.HeaderEventID) && m.EventID != "" && len(m.EventID) <= ReferenceFieldMaxBytes {
		out = append(out, Header{Key: idem.HeaderEventID, Value: []byte(m.EventID)})
	}
	return out
}

// ReferenceKey is the key of m's reference copy: m.Key (so that it goes
// to the partition the full copy would take) when it is at most
// ReferenceFieldMaxBytes, else none.
func ReferenceKey(m *Message) []byte {
	if len(m.Key) <= ReferenceFieldMaxBytes {
		return m.Key
	}
	return nil
}

// MessageSize is m's key, value and headers in bytes: the dlq-size of its
// reference copy.
func MessageSize(m *Message) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func (dl DeadLetter) appendDLQ(out []Header, source string) []Header {
	return append(out,
		Header{Key: idem.HeaderDeadLetterError, Value: []byte(dl.Error)},
		Header{Key: idem.HeaderDeadLetterSource, Value: []byte(source)},
		Header{Key: idem.HeaderDeadLetterAttempts, Value: []byte(strconv.Itoa(dl.Attempts))},
		Header{Key: idem.HeaderDeadLetterConsumer, Value: []byte(dl.ConsumerID)},
	)
}

func hasHeader(hs []Header, key string) bool {
	for _, h := range hs {
		if h.Key == key {
			return true
		}
	}
	return false
}
