package chaos

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemkit/idem"
)

// The second audit: a model-based check of what the client saw.
//
// The driver records every HTTP attempt of every POST (history) and, at the
// end, porcupine checks each logical operation's attempts against a
// sequential model of an Idempotency-Key endpoint that knows nothing of
// billing: the first request of a key executes once; a later one gets the
// same answer replayed (Idempotent-Replayed: true), 409 in progress, or,
// sent with another body, IDEMPOTENCY_KEY_REUSED; a key released by a 5xx,
// a 408 or a 429 may execute again; an attempt that got no answer (a
// killed instance, a cut connection, a timeout) may have executed at any
// moment after it was sent, or not at all, and so may one answered 5xx (a
// COMMIT whose acknowledgement a crash or a cut lost). The history is partitioned by
// the logical key: the key the driver means for the operation, which is the
// key it sends unless --unsafe=key mints a fresh one per retry (the bug that
// the model then sees as a second execution of one operation).

// Outcomes of one attempt, as the client classifies its answer.
const (
	outFresh      = "fresh"       // a final answer, not marked as a replay
	outReplay     = "replay"      // Idempotent-Replayed: true
	outInProgress = "in-progress" // 409 IDEMPOTENCY_KEY_IN_PROGRESS
	outReused     = "reused"      // 409/422 IDEMPOTENCY_KEY_REUSED
	outReleased   = "released"    // 5xx, 408, 429: the key is released
	outNoAnswer   = "no-answer"   // transport error or timeout
)

// HistoryOp is one HTTP attempt of a POST, as the client saw it. Times are
// nanoseconds since the driver started; Return is -1 for an attempt that
// got no answer.
type HistoryOp struct {
	Op       string `json:"op"`  // the logical key
	Key      string `json:"key"` // the Idempotency-Key sent
	Path     string `json:"path"`
	Body     string `json:"body"` // sha256 of the request body, 12 hex digits
	Call     int64  `json:"call"`
	Return   int64  `json:"return"`
	Status   int    `json:"status,omitempty"`
	Answer   string `json:"answer,omitempty"` // sha256 of the answer body
	Replayed bool   `json:"replayed,omitempty"`
	Code     string `json:"code,omitempty"` // problem+json code
	// Attempt is the attempt's number within its POST (0: the first);
	// Dup marks the concurrent duplicate, Probe a key reused with another
	// body on purpose. They do not enter the model; the timeline counts
	// them.
	Attempt int  `json:"attempt,omitempty"`
	Dup     bool `json:"dup,omitempty"`
	Probe   bool `json:"probe,omitempty"`
}

// outcome classifies the attempt.
func (h HistoryOp) outcome() string {
	switch {
	case h.Return < 0:
		return outNoAnswer
	case h.Status >= 500, h.Status == http.StatusRequestTimeout, h.Status == http.StatusTooManyRequests:
		return outReleased
	case h.Status == http.StatusConflict && h.Code == idem.CodeKeyInProgress:
		return outInProgress
	case (h.Status == http.StatusConflict || h.Status == http.StatusUnprocessableEntity) && h.Code == "IDEMPOTENCY_KEY_REUSED":
		return outReused
	case h.Replayed:
		return outReplay
	}
	return outFresh
}

// answer is what a replay must repeat: the status and the body's hash.
func (h HistoryOp) answer() string { return fmt.Sprintf("%d:%s", h.Status, h.Answer) }

func hash12(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:6])
}

// attemptID names one attempt for the history.
type attemptID struct {
	op, key    string
	n          int
	dup, probe bool
}

// history is the driver's record of attempts.
type history struct {
	t0  time.Time
	mu  sync.Mutex
	ops []HistoryOp
}

func newHistory() *history { return &history{t0: time.Now()} }

// call notes the start of an attempt; the returned function ends it with
// the answer (err != nil: no answer).
func (h *history) call(a attemptID, path string, body []byte) func(st int, hdr http.Header, resp []byte, err error) {
	rec := HistoryOp{Op: a.op, Key: a.key, Path: path, Body: hash12(body), Call: int64(time.Since(h.t0)),
		Attempt: a.n, Dup: a.dup, Probe: a.probe}
	return func(st int, hdr http.Header, resp []byte, err error) {
		if err != nil {
			rec.Return = -1
		} else {
			rec.Return = int64(time.Since(h.t0))
			rec.Status, rec.Answer, rec.Code = st, hash12(resp), problemCode(resp)
			rec.Replayed = hdr.Get("Idempotent-Replayed") == "true"
		}
		h.mu.Lock()
		h.ops = append(h.ops, rec)
		h.mu.Unlock()
	}
}

func (h *history) snapshot() []HistoryOp {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]HistoryOp(nil), h.ops...)
}

// keyState is the model's state for one key. It is comparable, as
// porcupine's default equality wants.
type keyState struct {
	claimed bool   // some request of the key may have claimed it
	body    string // the body of the request that claimed or executed it
	done    bool   // executed, its answer stored
	answer  string // the stored answer; "" while no one has seen it
}

// step is the sequential model of an Idempotency-Key endpoint: the states
// the key may be in after op, none when op is impossible.
func step(s keyState, op HistoryOp) []keyState {
	switch op.outcome() {
	case outNoAnswer:
		if s.done {
			return []keyState{s} // a replay, or a refusal, unseen
		}
		// Nothing (never arrived, or ran and was released), or it
		// executed and its answer is stored but unseen.
		held := s
		held.claimed = true
		if held.body == "" {
			held.body = op.Body
		}
		return []keyState{held, {claimed: true, body: op.Body, done: true}}
	case outReleased:
		// It claimed the key and released it, or met it done (a store
		// failure answers 503 without replaying). Or it executed: a COMMIT
		// whose acknowledgement was lost (a crash, a cut) is a failure to
		// the server, which answers 5xx, but the work and its answer are
		// stored, and the retry gets them replayed. A 5xx is as ambiguous
		// as no answer.
		if s.done {
			return []keyState{s}
		}
		held := s
		held.claimed = true
		if held.body == "" {
			held.body = op.Body
		}
		return []keyState{held, {claimed: true, body: op.Body, done: true}}
	case outInProgress:
		if !s.claimed {
			return nil
		}
		return []keyState{s}
	case outReused:
		if s.body == "" || s.body == op.Body {
			return nil
		}
		return []keyState{s}
	case outReplay:
		if !s.done || s.body != op.Body || (s.answer != "" && s.answer != op.answer()) {
			return nil
		}
		s.answer = op.answer()
		return []keyState{s}
	default: // outFresh
		if s.done {
			return nil
		}
		return []keyState{{claimed: true, body: op.Body, done: true, answer: op.answer()}}
	}
}

var keyModel = (&porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{keyState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		next := step(state.(keyState), input.(HistoryOp))
		out := make([]interface{}, len(next))
		for i, s := range next {
			out[i] = s
		}
		return out
	},
	DescribeOperation: func(input, output interface{}) string {
		op := input.(HistoryOp)
		switch op.outcome() {
		case outNoAnswer:
			return fmt.Sprintf("%s key %s body %s → no answer", op.Path, op.Key, op.Body)
		case outFresh, outReplay:
			return fmt.Sprintf("%s key %s body %s → %s %d answer %s", op.Path, op.Key, op.Body, op.outcome(), op.Status, op.Answer)
		}
		return fmt.Sprintf("%s key %s body %s → %s %d", op.Path, op.Key, op.Body, op.outcome(), op.Status)
	},
	DescribeState: func(state interface{}) string {
		s := state.(keyState)
		switch {
		case s.done && s.answer == "":
			return "executed (body " + s.body + "), answer unseen"
		case s.done:
			return "executed (body " + s.body + "), answer " + s.answer
		case s.claimed:
			return "claimed or released (body " + s.body + ")"
		}
		return "fresh"
	},
}).ToModel()

// Linearizability is the outcome of the second audit.
type Linearizability struct {
	// Verdict is "yes", "no" or "unknown" (the check timed out on some
	// key).
	Verdict string `json:"verdict"`
	Ops     int    `json:"ops"`
	Keys    int    `json:"keys"`
	// FailingKeys counts the keys whose history is not linearizable;
	// Failing is the smallest of them, attempt by attempt.
	FailingKeys int         `json:"failing_keys,omitempty"`
	Failing     []HistoryOp `json:"failing,omitempty"`
	FailingKey  string      `json:"failing_key,omitempty"`
	// HTML is porcupine's visualization of the smallest failing key
	// history (written by the harness next to its report).
	HTML []byte `json:"-"`
	// HTMLPath is where it was written, when it was.
	HTMLPath string `json:"html_path,omitempty"`
}

// checkTimeoutPerKey bounds porcupine on one key's history (a handful of
// attempts: it takes microseconds).
const checkTimeoutPerKey = 10 * time.Second

// checkLinearizable checks every logical key's history against the model.
func checkLinearizable(ctx context.Context, ops []HistoryOp) Linearizability {
	byOp := map[string][]porcupine.Operation{}
	for _, op := range ops {
		ret := op.Return
		if ret < 0 {
			// It may take effect at any moment after it was sent.
			ret = math.MaxInt64 / 2
		}
		byOp[op.Op] = append(byOp[op.Op], porcupine.Operation{Input: op, Output: nil, Call: op.Call, Return: ret})
	}
	names := make([]string, 0, len(byOp))
	for k := range byOp {
		names = append(names, k)
	}
	sort.Strings(names)
	res := Linearizability{Verdict: "yes", Ops: len(ops), Keys: len(byOp)}
	var smallest []porcupine.Operation
	var smallestInfo porcupine.LinearizationInfo
	for _, k := range names {
		if ctx.Err() != nil {
			res.Verdict = "unknown"
			break
		}
		h := byOp[k]
		sort.Slice(h, func(i, j int) bool { return h[i].Call < h[j].Call })
		for i := range h {
			h[i].ClientId = i // one lane per attempt in the visualization
		}
		verdict, info := porcupine.CheckOperationsVerbose(keyModel, h, checkTimeoutPerKey)
		switch verdict {
		case porcupine.Illegal:
			res.Verdict = "no"
			res.FailingKeys++
			if smallest == nil || len(h) < len(smallest) {
				smallest, smallestInfo, res.FailingKey = h, info, k
			}
		case porcupine.Unknown:
			if res.Verdict == "yes" {
				res.Verdict = "unknown"
			}
		}
	}
	if smallest != nil {
		for _, o := range smallest {
			res.Failing = append(res.Failing, o.Input.(HistoryOp))
		}
		var b bytes.Buffer
		if porcupine.Visualize(keyModel, smallestInfo, &b) == nil {
			res.HTML = b.Bytes()
		}
	}
	return res
}

// describe is one line per attempt of h, for the text report.
func describeHistory(h []HistoryOp) []string {
	var out []string
	for _, op := range h {
		ret := "∞"
		if op.Return >= 0 {
			ret = fmt.Sprintf("%.3fs", float64(op.Return)/1e9)
		}
		out = append(out, fmt.Sprintf("[%.3fs, %s] %s", float64(op.Call)/1e9, ret,
			strings.TrimSpace(keyModel.DescribeOperation(op, nil))))
	}
	return out
}
