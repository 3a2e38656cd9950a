package chaos

import (
	"context"
	"strings"
	"testing"
)

// op builds one attempt of key "k" (its logical key op) over [call, ret]
// (ret -1: no answer).
func hop(key, body string, call, ret int64, status int, answer string, replayed bool, code string) HistoryOp {
	op := key
	if i := strings.Index(key, "-r"); i > 0 {
		op = key[:i]
	}
	return HistoryOp{Op: op, Key: key, Path: "/payments", Body: body, Call: call, Return: ret, Status: status, Answer: answer, Replayed: replayed, Code: code}
}

// The model refuses each hand-made bad history and accepts the good ones;
// every history is one key, checked alone.
func TestLinearizabilityModel(t *testing.T) {
	t.Parallel()
	const reused, inProgress = "IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_KEY_IN_PROGRESS"
	testCases := []struct {
		name string
		ops  []HistoryOp
		want string
	}{
		{"double execution", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", false, ""),
			hop("k", "b1", 20, 30, 201, "a2", false, ""),
		}, "no"},
		{"double execution, same answer", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", false, ""),
			hop("k", "b1", 20, 30, 201, "a1", false, ""),
		}, "no"},
		{"concurrent double execution", []HistoryOp{
			hop("k", "b1", 0, 30, 201, "a1", false, ""),
			hop("k", "b1", 5, 25, 201, "a2", false, ""),
		}, "no"},
		{"retry under a fresh key (unsafe=key)", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", false, ""),
			hop("k-r1", "b1", 20, 30, 201, "a2", false, ""),
		}, "no"},
		{"replay with another body", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", false, ""),
			hop("k", "b2", 20, 30, 201, "a1", true, ""),
		}, "no"},
		{"replay of another answer", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", false, ""),
			hop("k", "b1", 20, 30, 201, "a2", true, ""),
		}, "no"},
		{"two replays of an unseen answer differ", []HistoryOp{
			hop("k", "b1", 0, -1, 0, "", false, ""),
			hop("k", "b1", 20, 30, 201, "a1", true, ""),
			hop("k", "b1", 40, 50, 201, "a2", true, ""),
		}, "no"},
		{"reuse accepted: another body executed", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", false, ""),
			hop("k", "b2", 20, 30, 201, "a2", false, ""),
		}, "no"},
		{"replay of nothing", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", true, ""),
		}, "no"},
		{"reused with the same body", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", false, ""),
			hop("k", "b1", 20, 30, 409, "p", false, reused),
		}, "no"},
		{"in progress with nothing in flight", []HistoryOp{
			hop("k", "b1", 0, 10, 409, "p", false, inProgress),
			hop("k", "b1", 20, 30, 201, "a1", false, ""),
		}, "no"},

		{"released key executes again", []HistoryOp{
			hop("k", "b1", 0, 10, 500, "e", false, ""),
			hop("k", "b1", 20, 30, 503, "e", false, ""),
			hop("k", "b1", 40, 50, 201, "a1", false, ""),
			hop("k", "b1", 60, 70, 201, "a1", true, ""),
		}, "yes"},
		{"no answer, then executed", []HistoryOp{
			hop("k", "b1", 0, -1, 0, "", false, ""),
			hop("k", "b1", 20, 30, 409, "p", false, inProgress),
			hop("k", "b1", 40, 50, 201, "a1", false, ""),
		}, "yes"},
		{"no answer, then its answer replayed", []HistoryOp{
			hop("k", "b1", 0, -1, 0, "", false, ""),
			hop("k", "b1", 20, 30, 201, "a1", true, ""),
			hop("k", "b1", 40, 50, 201, "a1", true, ""),
		}, "yes"},
		{"concurrent duplicate held off", []HistoryOp{
			hop("k", "b1", 0, 30, 201, "a1", false, ""),
			hop("k", "b1", 5, 10, 409, "p", false, inProgress),
			hop("k", "b1", 15, 40, 201, "a1", true, ""),
		}, "yes"},
		{"reuse refused", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", false, ""),
			hop("k", "b2", 20, 30, 409, "p", false, reused),
			hop("k", "b3", 40, 50, 422, "p", false, reused),
			hop("k", "b1", 60, 70, 201, "a1", true, ""),
		}, "yes"},
		{"a 503 whose commit went through: its answer replayed", []HistoryOp{
			hop("k", "b1", 0, 10, 503, "e", false, ""),
			hop("k", "b1", 20, 30, 200, "a1", true, ""),
		}, "yes"},
		{"a 503 whose commit went through, then executed again", []HistoryOp{
			hop("k", "b1", 0, 10, 503, "e", false, ""),
			hop("k", "b1", 20, 30, 200, "a1", true, ""),
			hop("k", "b1", 40, 50, 200, "a2", false, ""),
		}, "no"},
		{"a store failure meets a done key", []HistoryOp{
			hop("k", "b1", 0, 10, 201, "a1", false, ""),
			hop("k", "b1", 20, 30, 503, "e", false, ""),
			hop("k", "b1", 40, 50, 201, "a1", true, ""),
		}, "yes"},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := checkLinearizable(context.Background(), tt.ops)
			if got.Verdict != tt.want {
				t.Fatalf("linearizable: %s, want %s\n%s", got.Verdict, tt.want, strings.Join(describeHistory(tt.ops), "\n"))
			}
			if got.Keys != 1 || got.Ops != len(tt.ops) {
				t.Errorf("checked %d ops of %d keys, want %d of 1", got.Ops, got.Keys, len(tt.ops))
			}
			if tt.want == "no" && (got.FailingKey != "k" || len(got.Failing) != len(tt.ops) || len(got.HTML) == 0) {
				t.Errorf("failing key %q with %d ops and %d bytes of HTML, want k, %d ops and a visualization", got.FailingKey, len(got.Failing), len(got.HTML), len(tt.ops))
			}
		})
	}
}

// The history is partitioned by logical key; the report names the
// smallest failing key's history.
func TestLinearizabilitySmallestFailingKey(t *testing.T) {
	t.Parallel()
	ops := []HistoryOp{
		hop("big", "b1", 0, 10, 201, "a1", false, ""),
		hop("big", "b1", 20, 30, 409, "p", false, "IDEMPOTENCY_KEY_IN_PROGRESS"),
		hop("big", "b1", 40, 50, 201, "a2", false, ""),
		hop("ok", "b1", 0, 10, 201, "a1", false, ""),
		hop("ok", "b1", 20, 30, 201, "a1", true, ""),
		hop("small", "b1", 5, 15, 201, "a1", false, ""),
		hop("small", "b1", 25, 35, 201, "a2", false, ""),
	}
	got := checkLinearizable(context.Background(), ops)
	if got.Verdict != "no" || got.Keys != 3 || got.FailingKeys != 2 || got.FailingKey != "small" || len(got.Failing) != 2 {
		t.Fatalf("got %s, %d keys, %d failing, smallest %q (%d ops); want no, 3, 2, small (2)", got.Verdict, got.Keys, got.FailingKeys, got.FailingKey, len(got.Failing))
	}
	if !strings.Contains(string(got.HTML), "<html") {
		t.Errorf("the visualization is not HTML: %.200s", got.HTML)
	}
}
