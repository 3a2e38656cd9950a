package idemclient_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem/idemclient"
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
