package redisstore_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/redisstore"
)

func TestOpenRefusesBadURLs(t *testing.T) {
	t.Parallel()
	testCases := []struct{ name, url string }{
		{"empty", ""},
		{"no scheme", "127.0.0.1:6379"},
		{"postgres", "postgres://postgres@127.0.0.1:5432/test"},
		{"http", "http://127.0.0.1:6379"},
		{"database not a number", "redis://127.0.0.1:6379/zero"},
		{"path too deep", "redis://127.0.0.1:6379/0/1"},
		{"unknown option", "redis://127.0.0.1:6379/0?colour=blue"},
		{"bad option value", "redis://127.0.0.1:6379/0?dial_timeout=soon"},
		{"empty prefix", "redis://127.0.0.1:6379/0?prefix="},
		{"bad port", "redis://127.0.0.1:port/0"},
		{"password quoted", "redis://user:s3cretpass@127.0.0.1:6379/0?dial_timeout=s3cretpass"},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := redisstore.Open(tt.url, nil)
			if !errors.Is(err, redisstore.ErrInvalidURL) {
				if s != nil {
					_ = s.Close()
				}
				t.Fatalf("Open(%q) = %v, want ErrInvalidURL", tt.url, err)
			}
			if s != nil {
				t.Error("a store with the error")
			}
			if strings.Contains(err.Error(), "s3cretpass") {
				t.Errorf("the error quotes the password: %v", err)
			}
		})
	}
}

func TestOpenRefusesABadConfig(t *testing.T) {
	t.Parallel()
	_, err := redisstore.Open("redis://"+redisAddr()+"/0", &redisstore.Config{MaxResponseBytes: -1})
	if !errors.Is(err, redisstore.ErrInvalidConfig) {
		t.Fatalf("err %v, want ErrInvalidConfig", err)
	}
}

func TestIsURL(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"redis://h:1/0": true, "REDIS://h": true, "rediss://h": true, "unix:///tmp/r.sock": true,
		"postgres://h/db": false, "memory": false, "redis": false, "": false,
	} {
		if got := redisstore.IsURL(s); got != want {
			t.Errorf("IsURL(%q) = %v, want %v", s, got, want)
		}
	}
}

// A store of Open's works against the server, writes under the URL's
// prefix, and owns its client: Close closes it, twice without harm.
func TestOpenUsesTheURLAndItsPrefix(t *testing.T) {
	t.Parallel()
	c := newClient(t, redisAddr())
	p := testPrefix(t, c)
	s, err := redisstore.Open("redis://"+redisAddr()+"/0?prefix="+p+"&dial_timeout=5s", &redisstore.Config{Logger: quiet(), Prefix: "{a-default}:"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k := idempotency.HashKey("alice", http.MethodPost, "POST /x", "k1")
	res, err := s.Claim(ctx, idempotency.Claim{Key: k, Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if !strings.HasPrefix(s.RecordKey(k), p) {
		t.Errorf("record key %q is not under the URL's prefix %q", s.RecordKey(k), p)
	}
	if n, err := c.Exists(ctx, s.RecordKey(k)).Result(); err != nil || n != 1 {
		t.Errorf("the record is not in the server: %d, %v", n, err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if _, err := s.Claim(ctx, idempotency.Claim{Key: k, Lease: time.Minute, Retention: time.Hour}); err == nil {
		t.Error("a claim after Close succeeded: the client was not closed")
	}
}

// Close on a store of New leaves the caller's client alone.
func TestCloseLeavesACallersClient(t *testing.T) {
	t.Parallel()
	st := newSetup(t, nil)
	if err := st.store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.client.Ping(context.Background()).Err(); err != nil {
		t.Errorf("the caller's client was closed: %v", err)
	}
}
