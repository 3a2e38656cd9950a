package chaos

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCheckKafka(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	row := func(id, typ, agg string, seq int64, topic string) outboxRow {
		return outboxRow{EventID: id, Topic: topic, AggregateType: typ, AggregateID: agg, Seq: seq, EventType: "E", Status: "PUBLISHED", Attempts: 1}
	}
	rec := func(r outboxRow, part int32, off int64, ms int) wireRecord {
		return wireRecord{EventID: r.EventID, AggregateType: r.AggregateType, AggregateID: r.AggregateID, Seq: r.Seq,
			Topic: r.Topic, Partition: part, Offset: off, Timestamp: t0.Add(time.Duration(ms) * time.Millisecond)}
	}
	// Order o1: seq 1 to topic a, seq 2 to topic b, seq 3 to topic a.
	a1, b2, a3 := row("e1", "order", "o1", 1, "a"), row("e2", "order", "o1", 2, "b"), row("e3", "order", "o1", 3, "a")
	p1 := row("e4", "payment", "p1", 1, "b")
	rows := []outboxRow{a1, b2, a3, p1}
	inOrder := []wireRecord{rec(a1, 0, 10, 0), rec(b2, 1, 5, 3), rec(a3, 0, 11, 7), rec(p1, 2, 0, 1)}

	testCases := []struct {
		name      string
		recs      []wireRecord
		want      []string // violation kinds, sorted
		subject   string   // of the first violation
		detail    string   // in the first violation
		redeliver int
	}{
		{name: "in order", recs: inOrder},
		{name: "same millisecond across topics is not a reordering",
			recs: []wireRecord{rec(a1, 0, 10, 5), rec(b2, 1, 5, 5), rec(a3, 0, 11, 5), rec(p1, 2, 0, 1)}},
		{name: "a redelivered copy later is fine, and counted",
			recs:      append(slices.Clone(inOrder), rec(a1, 0, 12, 9), rec(b2, 1, 6, 9)),
			redeliver: 2},
		{name: "a late stale copy older than the first is still first by timestamp",
			recs:      append(slices.Clone(inOrder), rec(b2, 1, 7, 2)),
			redeliver: 1},
		{name: "lost: published but on no topic",
			recs: []wireRecord{rec(a1, 0, 10, 0), rec(a3, 0, 11, 7), rec(p1, 2, 0, 1)},
			want: []string{"lost-event"}, subject: "event e2", detail: "order o1 seq 2 (E to b) is on no topic; outbox status PUBLISHED"},
		{name: "reordered across topics: seq 2 produced before seq 1",
			recs: []wireRecord{rec(a1, 0, 10, 8), rec(b2, 1, 5, 3), rec(a3, 0, 11, 9), rec(p1, 2, 0, 1)},
			want: []string{"reordered-event"}, subject: "event e2", detail: "order o1 seq 2 (b) first delivered before seq 1 (a, event e1)"},
		{name: "reordered in one partition by offset, whatever the timestamps",
			recs: []wireRecord{rec(a1, 0, 11, 0), rec(b2, 1, 5, 3), rec(a3, 0, 10, 7), rec(p1, 2, 0, 1)},
			want: []string{"reordered-event"}, subject: "event e3", detail: "offset 10 before 11 in a[0]"},
		{name: "not neighbours: seq 3 before seq 1",
			recs: []wireRecord{rec(a1, 0, 10, 0), rec(b2, 1, 5, 3), rec(a3, 0, 9, 7), rec(p1, 2, 0, 1)},
			want: []string{"reordered-event"}, subject: "event e3"},
		{name: "misrouted: a copy with another sequence header",
			recs: append(slices.Clone(inOrder), func() wireRecord { r := rec(p1, 2, 1, 2); r.Seq = 7; return r }()),
			want: []string{"misrouted-event"}, subject: "event e4", redeliver: 1},
		{name: "another run's records are ignored",
			recs: append(slices.Clone(inOrder), wireRecord{EventID: "zz", Topic: "a", Offset: 1, Timestamp: t0}),
		},
		{name: "nothing on the wire: every event lost",
			want: []string{"lost-event", "lost-event", "lost-event", "lost-event"}, subject: "event e1"},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := checkKafka(rows, tt.recs)
			if got := kinds(res.violations); !slices.Equal(got, tt.want) {
				t.Fatalf("violations %v, want %v: %+v", got, tt.want, res.violations)
			}
			if res.events != 4 || res.aggregates != 2 {
				t.Errorf("checked %d events of %d aggregates, want 4 of 2", res.events, res.aggregates)
			}
			if res.redelivered != tt.redeliver {
				t.Errorf("redelivered %d, want %d", res.redelivered, tt.redeliver)
			}
			if len(tt.want) == 0 {
				return
			}
			v := res.violations[0]
			if v.Subject != tt.subject || !strings.Contains(v.Detail, tt.detail) {
				t.Errorf("first violation %q: %q; want %q containing %q", v.Subject, v.Detail, tt.subject, tt.detail)
			}
		})
	}
}
