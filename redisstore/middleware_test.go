package redisstore_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
)

const racers = 50

// TestMiddlewareOneKeyOneRun: 50 clients send the same request with the
// same key at once, over HTTP, through the real middleware over the store:
// the handler runs exactly once; while it runs every other request gets
// 409 in progress; afterwards every retry gets its response replayed.
// With Config.Wait the 49 wait for it instead and get the replay directly.
func TestMiddlewareOneKeyOneRun(t *testing.T) {
	t.Parallel()
	for _, wait := range []time.Duration{0, 30 * time.Second} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			t.Parallel()
			su := newSetup(t, nil)
			mw, err := idempotency.New(su.store, &idempotency.Config{
				Scope:            func(*http.Request) (string, error) { return "alice", nil },
				Wait:             wait,
				ReplayCacheBytes: -1, // every replay from Redis
			})
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			release := make(chan struct{})
			mux := http.NewServeMux()
			mux.Handle("POST /charges", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				<-release // hold the key while the others arrive
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"charge":`+strconv.FormatInt(n, 10)+`}`)
			})))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: racers}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: time.Minute}

			type answer struct {
				status   int
				replayed bool
				body     string
				err      error
			}
			post := func() answer {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":100}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "one-key")
				resp, err := client.Do(req)
				if err != nil {
					return answer{err: err}
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return answer{resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", string(b), err}
			}
			answers := make(chan answer, racers)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range racers {
				wg.Go(func() {
					<-start
					answers <- post()
				})
			}
			close(start)

			var got []answer
			if wait == 0 {
				// 49 answers come while the handler holds the key.
				for range racers - 1 {
					select {
					case a := <-answers:
						got = append(got, a)
					case <-time.After(time.Minute):
						t.Fatalf("only %d of %d racing requests answered while the handler ran (runs %d)", len(got), racers-1, runs.Load())
					}
				}
				for _, a := range got {
					if a.err != nil || a.status != http.StatusConflict {
						t.Fatalf("a racing request while the handler ran: %+v, want 409 in progress", a)
					}
				}
			} else {
				// The others wait (or arrive after the completion): all
				// of them must get the one response.
				waitFor(t, "the handler to start", func() bool { return runs.Load() > 0 })
			}
			close(release)
			wg.Wait()
			close(answers)
			for a := range answers {
				got = append(got, a)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times for one key, want 1", n)
			}
			fresh := 0
			for _, a := range got {
				switch {
				case a.err != nil:
					t.Fatal(a.err)
				case a.status == http.StatusCreated && !a.replayed:
					fresh++
				}
			}
			if fresh != 1 {
				t.Fatalf("%d fresh 201 answers, want 1", fresh)
			}
			if wait > 0 {
				for _, a := range got {
					if a.status != http.StatusCreated || a.body != `{"charge":1}` {
						t.Fatalf("a waiting request got %+v, want the replay of {\"charge\":1}", a)
					}
				}
			}
			// Every retry now replays the one response, from Redis.
			for range 5 {
				a := post()
				if a.err != nil || a.status != http.StatusCreated || !a.replayed || a.body != `{"charge":1}` {
					t.Fatalf("retry after completion: %+v, want the replayed 201", a)
				}
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want 1", n)
			}
		})
	}
}
