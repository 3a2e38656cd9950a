package kafkago

import (
	"context"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestGenStateFailsOpen: the generation check never stops the commits of
// a Reader whose log it cannot read (another kafka-go, or no line yet):
// every ack is committed, as kafka-go alone would. Once a generation is
// read, only its partitions from their start offsets are; between two
// generations, none.
func TestGenStateFailsOpen(t *testing.T) {
	kms := []kafka.Message{{Topic: "t", Partition: 0, Offset: 7}, {Topic: "t", Partition: 1, Offset: 3}}
	commit := func(g *genState) (mine, skipped int) {
		_, m, s, done := g.commitable(context.Background(), kms)
		done()
		return len(m), len(s)
	}
	type tp struct {
		topic     string
		partition int
	}
	for _, tt := range []struct {
		name          string
		lines         [][]any // logSubscribed arguments, then nil for logStoppedCommit
		mine, skipped int
	}{
		{"no line yet", nil, 2, 0},
		{"an assignment it cannot read", [][]any{{"t[0 1]"}}, 2, 0},
		{"an assignment of one partition", [][]any{{map[tp]int64{{"t", 0}: 5}}}, 1, 1},
		{"a start past the message", [][]any{{map[tp]int64{{"t", 0}: 9, {"t", 1}: 0}}}, 1, 1},
		{"between two generations", [][]any{{map[tp]int64{{"t", 0}: 5, {"t", 1}: 0}}, nil}, 0, 2},
		{"a later line it cannot read", [][]any{{map[tp]int64{{"t", 0}: 5}}, nil, {42}}, 2, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := &genState{}
			for _, a := range tt.lines {
				if a == nil {
					g.observe(logStoppedCommit, []any{"group"})
					continue
				}
				g.observe(logSubscribed, a)
			}
			if mine, skipped := commit(g); mine != tt.mine || skipped != tt.skipped {
				t.Fatalf("committed %d, skipped %d; want %d, %d", mine, skipped, tt.mine, tt.skipped)
			}
		})
	}
}
