package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idempotency"
)

// The key is derived from the command, once; every attempt carries it.
func ExampleClient_Do() {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // the first attempt fails
			return
		}
		fmt.Println("server got key", r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	c, err := idemclient.New(srv.Client(), nil)
	if err != nil {
		panic(err)
	}
	key := idemclient.Key("o-42", "charge", "r-7") // order id + ":charge:" + request id
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/charges",
		strings.NewReader(`{"order_id":"o-42","customer_id":"c-1","amount_kopecks":1000}`))
	resp, err := c.Do(req, key)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", resp.Attempts, "attempts")
	// Output:
	// server got key o-42:charge:r-7
	// 201 after 2 attempts
}

// An unsafe request without a key is refused, not sent.
func ExampleClient_Do_withoutKey() {
	c, _ := idemclient.New(nil, nil)
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://127.0.0.1:1/charges", strings.NewReader("{}"))
	_, err := c.Do(req, "")
	fmt.Println(err)
	// Output:
	// idemclient: unsafe method without an Idempotency-Key: POST http://127.0.0.1:1/charges
}

// The whole story against the idempotency middleware over PostgreSQL: the
// provider charges, and its answer is lost on the way back. The client
// retries with the same key and gets the stored answer, marked replayed:
// one charge.
func Example() {
	db, done := newExampleDB() // a *pgxpool.Pool on a migrated schema
	defer done()
	mw, err := idempotency.New(idempotency.NewPostgresStore(db.Pool), &idempotency.Config{
		Scope: func(r *http.Request) (string, error) { return "shop-1", nil },
	})
	if err != nil {
		panic(err)
	}
	var charges atomic.Int32
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge_id":"ch-%d"}`, n)
	})))
	defer srv.Close()

	// A network that loses the first answer after the server sent it.
	var lost atomic.Bool
	flaky := &http.Client{Transport: lossy(func(r *http.Request) (*http.Response, error) {
		resp, err := srv.Client().Transport.RoundTrip(r)
		if err == nil && lost.CompareAndSwap(false, true) {
			resp.Body.Close()
			return nil, errors.New("connection reset by peer")
		}
		return resp, err
	})}
	c, err := idemclient.New(flaky, &idemclient.Config{
		Hook: func(ctx context.Context, e idemclient.Event) context.Context {
			if e.Kind == idemclient.EventRetry {
				fmt.Println("retry after attempt", e.Attempt, "because of", e.Reason)
			}
			return ctx
		},
	})
	if err != nil {
		panic(err)
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount_kopecks":1000}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req, idemclient.Key("o-42", "charge", "r-7"))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Replayed)
	fmt.Println("charges:", charges.Load())
	// Output:
	// retry after attempt 1 because of transport
	// 201 {"charge_id":"ch-1"} replayed: true
	// charges: 1
}

type lossy func(*http.Request) (*http.Response, error)

func (f lossy) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
