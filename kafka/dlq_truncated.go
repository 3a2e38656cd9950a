package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// parseSource splits a dlq-source "topic/partition/offset".
func parseSource(src string) (topic string, partition int32, offset int64, ok bool) {
	j := strings.LastIndexByte(src, '/')
	if j <= 0 {
		return "", 0, 0, false
	}
	i := strings.LastIndexByte(src[:j], '/')
	if i <= 0 {
		return "", 0, 0, false
	}
	p, perr := strconv.ParseInt(src[i+1:j], 10, 32)
	o, oerr := strconv.ParseInt(src[j+1:], 10, 64)
	if perr != nil || oerr != nil || p < 0 || o < 0 {
		return "", 0, 0, false
	}
	return src[:i], int32(p), o, true
}

// fillFromSource reads the original of the reference copy r from r.Source
// and puts its key, value and headers in r (FromSource). When the source
// no longer holds it (deleted by retention, or the topic is gone), it sets
// r.SourceGone and returns an error wrapping ErrSourceGone.
func (d *DLQ) fillFromSource(ctx context.Context, adm *kadm.Client, r *DeadLetterRecord) error {
	topic, partition, offset, ok := parseSource(r.Source)
	if !ok {
		r.SourceGone = true
		return fmt.Errorf("%w: %s: dlq-source %q is not topic/partition/offset", ErrSourceGone, r.ID(), r.Source)
	}
	rec, err := d.readOne(ctx, adm, topic, partition, offset)
	if errors.Is(err, ErrRecordNotFound) || errors.Is(err, ErrTopicNotFound) {
		r.SourceGone = true
		return fmt.Errorf("%w: %s: %s: %w", ErrSourceGone, r.ID(), r.Source, err)
	}
	if err != nil {
		return err
	}
	r.Key, r.Value, r.SourceHeaders, r.FromSource = rec.Key, rec.Value, rec.Headers, true
	return nil
}

// readOne reads the record at topic/partition/offset, or returns
// ErrRecordNotFound (before the log start: retention; at or past the
// end; a compacted gap) or ErrTopicNotFound.
func (d *DLQ) readOne(ctx context.Context, adm *kadm.Client, topic string, partition int32, offset int64) (*kgo.Record, error) {
	start, end, err := d.bounds(ctx, adm, topic, time.Time{})
	if err != nil {
		return nil, err
	}
	e, ok := end[partition]
	if !ok || offset < start[partition] || offset >= e {
		return nil, fmt.Errorf("%w: %s/%d/%d", ErrRecordNotFound, topic, partition, offset)
	}
	var found *kgo.Record
	err = d.readRange(ctx, topic, map[int32]int64{partition: offset}, map[int32]int64{partition: offset + 1}, func(rec *kgo.Record) error {
		found = rec
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil || found.Offset != offset {
		return nil, fmt.Errorf("%w: %s/%d/%d", ErrRecordNotFound, topic, partition, offset)
	}
	return found, nil
}
