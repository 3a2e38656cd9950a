package console_test

import (
	"context"
	"errors"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/console"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

type bundle struct {
	db  *testdb.DB
	srv *httptest.Server
	con *console.Console
}

func setup(t *testing.T, token string, mount string) *bundle {
	t.Helper()
	db := testdb.New(t)
	ctx := context.Background()
	msgs := []outbox.Message{
		{Topic: "orders.events", AggregateType: "order", AggregateID: "a", EventID: "a-1", EventType: "OrderConfirmed",
			Payload: []byte(`{"order_id":"a","note":"<script>alert(1)</script>"}`)},
		{Topic: "orders.events", AggregateType: "order", AggregateID: "a", EventID: "a-2", EventType: "OrderCharged"},
	}
	if _, err := outbox.Enqueue(ctx, db.Pool, msgs...); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox_event SET status = 'DEAD', attempts = 10, last_error = 'MESSAGE_TOO_LARGE' WHERE event_id = 'a-1'`); err != nil {
		t.Fatal(err)
	}
	con, err := console.New(db.Pool, &console.Config{Token: token, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = con
	if mount != "" {
		mux := http.NewServeMux()
		mux.Handle(mount+"/", console.Mount(mount, con))
		h = mux
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &bundle{db: db, srv: srv, con: con}
}

func client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func postForm(t *testing.T, c *http.Client, u string, v url.Values, hdr ...string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(v.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

var flashRe = regexp.MustCompile(`<div class="flash (ok|bad)" id="flash">([^<]*)</div>`)

// flashAt follows a redirect and returns the page's banner: "ok: …",
// "bad: …" or "".
func flashAt(t *testing.T, c *http.Client, base string, hdr http.Header) string {
	t.Helper()
	_, body, _ := get(t, c, base+hdr.Get("Location"))
	m := flashRe.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return m[1] + ": " + html.UnescapeString(m[2])
}

func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF field in page:\n%s", body)
	}
	return m[1]
}

func status(t *testing.T, b *bundle, id string) (string, []outbox.AuditEntry) {
	t.Helper()
	e, err := outbox.NewAdmin(b.db.Pool).Show(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return e.Status, e.Audit
}

// Without a token: the page lists the dead event (payload escaped), a
// requeue needs the CSRF field, and with it the event is PENDING with
// the console's audit entry.
func TestRequeueNeedsCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t, "", "")
	c := client(t)
	code, body, hdr := get(t, c, b.srv.URL+"/outbox")
	if code != 200 || !strings.Contains(body, `id="dead-a-1"`) || !strings.Contains(body, "MESSAGE_TOO_LARGE") {
		t.Fatalf("outbox page %d:\n%s", code, body)
	}
	if strings.Contains(body, "<script>alert") || !strings.Contains(body, "&lt;script&gt;") {
		t.Error("payload not escaped")
	}
	if !strings.Contains(hdr.Get("Content-Security-Policy"), "default-src 'self'") || hdr.Get("X-Frame-Options") != "DENY" {
		t.Errorf("headers %v", hdr)
	}
	if strings.Contains(body, "http://") || strings.Contains(body, "https://") {
		t.Error("the page refers to an external resource")
	}
	tok := csrfOf(t, body)

	// A token that differs from tok in its first character (a fixed "00"
	// prefix was tok itself one run in 256).
	wrong := "0" + tok[1:]
	if tok[0] == '0' {
		wrong = "1" + tok[1:]
	}
	for _, v := range []url.Values{{"id": {"a-1"}}, {"id": {"a-1"}, "csrf": {wrong}}} {
		if code, _, _ := postForm(t, c, b.srv.URL+"/outbox/requeue", v); code != http.StatusForbidden {
			t.Errorf("requeue with csrf %q: %d, want 403", v.Get("csrf"), code)
		}
	}
	// Another browser (no cookie) with a valid-looking token is refused.
	if code, _, _ := postForm(t, client(t), b.srv.URL+"/outbox/requeue", url.Values{"id": {"a-1"}, "csrf": {tok}}); code != http.StatusForbidden {
		t.Errorf("csrf without its cookie: %d", code)
	}
	if st, _ := status(t, b, "a-1"); st != "DEAD" {
		t.Fatalf("refused requests changed the event: %s", st)
	}
	if code, _, _ := get(t, c, b.srv.URL+"/outbox/requeue?id=a-1"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET requeue: %d, want 405", code)
	}

	code, _, hdr = postForm(t, c, b.srv.URL+"/outbox/requeue", url.Values{"id": {"a-1"}, "reason": {"limit raised"}, "csrf": {tok}})
	if code != http.StatusSeeOther || hdr.Get("Location") != "/outbox" {
		t.Fatalf("requeue: %d %v", code, hdr)
	}
	if f := flashAt(t, c, b.srv.URL, hdr); !strings.HasPrefix(f, "ok: requeued a-1") {
		t.Fatalf("banner after requeue: %q", f)
	}
	if f := flashAt(t, c, b.srv.URL, hdr); f != "" {
		t.Errorf("the banner shows twice: %q", f)
	}
	st, audit := status(t, b, "a-1")
	if st != "PENDING" || len(audit) != 1 || !strings.HasPrefix(audit[0].Actor, "console@127.0.0.1") || audit[0].Reason != "limit raised" {
		t.Fatalf("after requeue: %s %+v", st, audit)
	}
	// Twice: refused with the reason, shown on the page.
	_, _, hdr = postForm(t, c, b.srv.URL+"/outbox/requeue", url.Values{"id": {"a-1"}, "csrf": {tok}})
	if f := flashAt(t, c, b.srv.URL, hdr); !strings.HasPrefix(f, "bad: ") || !strings.Contains(f, "PENDING") {
		t.Errorf("second requeue: %q", f)
	}
	_, body, _ = get(t, c, b.srv.URL+"/outbox/event?id=a-1")
	if !strings.Contains(body, "limit raised") || !strings.Contains(body, `id="event-status">PENDING`) {
		t.Errorf("event page:\n%s", body)
	}
	if code, _, _ := get(t, c, b.srv.URL+"/outbox/event?id=nope"); code != http.StatusNotFound {
		t.Errorf("unknown event: %d", code)
	}
}

// Without a token the console answers only on a loopback host name.
func TestNoTokenLoopbackOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, "", "")
	req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/outbox", nil)
	req.Host = "attacker.example:8099"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("non-loopback Host: %d, want 403", resp.StatusCode)
	}
}

// With a token: nothing without it, a wrong one is refused, the login
// form or a bearer header gets in, and a state change still needs CSRF.
func TestTokenRequired(t *testing.T) {
	t.Parallel()
	b := setup(t, "s3cret-token", "")
	c := client(t)
	if code, _, hdr := get(t, c, b.srv.URL+"/outbox"); code != http.StatusSeeOther || !strings.HasSuffix(hdr.Get("Location"), "/login") {
		t.Errorf("GET without token: %d %v", code, hdr)
	}
	if code, _, _ := postForm(t, c, b.srv.URL+"/outbox/requeue", url.Values{"id": {"a-1"}}); code != http.StatusUnauthorized {
		t.Errorf("POST without token: %d", code)
	}
	req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/outbox", nil)
	req.Header.Set("Authorization", "Bearer wrong")
	if resp, err := c.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong bearer: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// Bearer with the token but no CSRF field: refused.
	if code, _, _ := postForm(t, c, b.srv.URL+"/outbox/requeue", url.Values{"id": {"a-1"}}, "Authorization", "Bearer s3cret-token"); code != http.StatusForbidden {
		t.Errorf("bearer without CSRF: %d", code)
	}
	_, body, _ := get(t, c, b.srv.URL+"/login")
	tok := csrfOf(t, body)
	if code, _, _ := postForm(t, c, b.srv.URL+"/login", url.Values{"token": {"nope"}, "csrf": {tok}}); code != http.StatusUnauthorized {
		t.Errorf("wrong token at login: %d", code)
	}
	if code, _, _ := postForm(t, c, b.srv.URL+"/login", url.Values{"token": {"s3cret-token"}}); code != http.StatusForbidden {
		t.Errorf("login without CSRF: %d", code)
	}
	if code, _, _ := postForm(t, c, b.srv.URL+"/login", url.Values{"token": {"s3cret-token"}, "csrf": {tok}}); code != http.StatusBadRequest {
		t.Fatalf("login without a name: %d, want 400", code)
	}
	code, _, hdr := postForm(t, c, b.srv.URL+"/login", url.Values{"token": {"s3cret-token"}, "name": {"alice"}, "csrf": {tok}})
	if code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	for _, ck := range hdr.Values("Set-Cookie") {
		if strings.Contains(ck, "s3cret-token") {
			t.Errorf("a cookie carries the token: %s", ck)
		}
	}
	code, body, _ = get(t, c, b.srv.URL+"/outbox")
	if code != 200 || !strings.Contains(body, `id="dead-a-1"`) {
		t.Fatalf("outbox after login: %d", code)
	}
	code, _, _ = postForm(t, c, b.srv.URL+"/outbox/discard", url.Values{"id": {"a-1"}, "reason": {"cancelled"}, "csrf": {csrfOf(t, body)}})
	if st, audit := status(t, b, "a-1"); code != http.StatusSeeOther || st != "DISCARDED" || len(audit) != 1 || audit[0].Action != "discard" ||
		!strings.HasPrefix(audit[0].Actor, "alice (console session ") {
		t.Fatalf("discard: %d %s %+v", code, st, audit)
	}
}

// Mounted under a prefix, links and redirects keep it; the other pages
// render.
func TestMountedPages(t *testing.T) {
	t.Parallel()
	b := setup(t, "", "/admin/console")
	c := client(t)
	code, body, _ := get(t, c, b.srv.URL+"/admin/console/outbox")
	if code != 200 || !strings.Contains(body, `action="/admin/console/outbox/requeue"`) {
		t.Fatalf("mounted outbox %d", code)
	}
	if code, _, hdr := get(t, c, b.srv.URL+"/admin/console/"); code != http.StatusSeeOther || hdr.Get("Location") != "/admin/console/outbox" {
		t.Errorf("root: %d %v", code, hdr)
	}
	for _, p := range []string{"/keys", "/inbox", "/keys?principal=alice&route=POST+/orders&key=k1"} {
		if code, body, _ := get(t, c, b.srv.URL+"/admin/console"+p); code != 200 {
			t.Errorf("%s: %d\n%s", p, code, body)
		}
	}
	if _, body, _ := get(t, c, b.srv.URL+"/admin/console/keys?principal=alice&route=POST+/orders&key=k1"); !strings.Contains(body, "No record and no request holds this key") {
		t.Errorf("key lookup:\n%s", body)
	}
	_, body, _ = get(t, c, b.srv.URL+"/admin/console/outbox")
	if !strings.Contains(body, "No samples yet") {
		t.Error("chart before any sample")
	}
	b.con.Sample(context.Background())
	b.con.Sample(context.Background())
	_, body, _ = get(t, c, b.srv.URL+"/admin/console/outbox")
	if !strings.Contains(body, "<polyline") || !strings.Contains(body, "2 samples") {
		t.Errorf("chart after samples:\n%s", body)
	}
}

func TestNewValidatesAndStops(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	if _, err := console.New(nil, nil); !errors.Is(err, console.ErrInvalidConfig) {
		t.Errorf("nil db: %v", err)
	}
	if _, err := console.New(db.Pool, &console.Config{SampleInterval: time.Hour, SampleWindow: time.Minute}); !errors.Is(err, console.ErrInvalidConfig) {
		t.Errorf("window < interval: %v", err)
	}
	con, err := console.New(db.Pool, &console.Config{SampleInterval: time.Millisecond, SampleWindow: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := con.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := con.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := con.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := con.HardStop(ctx); err != nil {
		t.Fatal(err)
	}
}

// The dead-letter page lists a topic's records; redrive (POST with CSRF
// and a reason) republishes them once, only for the console's topics, and
// records the signed-in session's name in idem_admin_audit.
func TestDeadLetterPageRedrive(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	kc := testkafka.New(t)
	kc.CreateTopic(t, "orders.events", 1)
	kc.CreateTopic(t, "orders.events.dlq", 1)
	rec := &kgo.Record{Topic: "orders.events.dlq", Key: []byte("o1"), Value: []byte(`{"x":1}`), Headers: []kgo.RecordHeader{
		{Key: kafka.HeaderEventID, Value: []byte("ev-1")},
		{Key: kafka.HeaderDeadLetterError, Value: []byte("handler: boom")},
		{Key: kafka.HeaderDeadLetterSource, Value: []byte("orders.events/0/0")},
	}}
	if err := kc.Client(t).ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	const token = "s3cret-token-0123456789"
	con, err := console.New(db.Pool, &console.Config{Token: token, DLQ: kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...)),
		DeadLetterTopics: []string{"orders.events.dlq"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	c := client(t)
	signIn(t, c, srv.URL, token, "erin")
	code, body, _ := get(t, c, srv.URL+"/dlq")
	if code != 200 || !strings.Contains(body, "handler: boom") || !strings.Contains(body, "ev-1") {
		t.Fatalf("dlq page %d:\n%s", code, body)
	}
	tok := csrfOf(t, body)
	if code, _, _ := postForm(t, c, srv.URL+"/dlq/redrive", url.Values{"from": {"orders.events.dlq"}}); code != http.StatusForbidden {
		t.Errorf("redrive without CSRF: %d", code)
	}
	_, _, hdr := postForm(t, c, srv.URL+"/dlq/redrive", url.Values{"from": {"other.dlq"}, "csrf": {tok}})
	if f := flashAt(t, c, srv.URL, hdr); !strings.HasPrefix(f, "bad: ") {
		t.Errorf("redrive of a topic not configured: %q", f)
	}
	_, _, hdr = postForm(t, c, srv.URL+"/dlq/redrive", url.Values{"from": {"orders.events.dlq"}, "csrf": {tok}})
	if f := flashAt(t, c, srv.URL, hdr); !strings.HasPrefix(f, "bad: a reason is required") {
		t.Errorf("redrive without a reason: %q", f)
	}
	for _, want := range []string{"ok: redrove 1 records from orders.events.dlq (0 already", "ok: redrove 0 records from orders.events.dlq (1 already"} {
		_, _, hdr = postForm(t, c, srv.URL+"/dlq/redrive", url.Values{"from": {"orders.events.dlq"}, "reason": {"fixed"}, "csrf": {tok}})
		if f := flashAt(t, c, srv.URL, hdr); !strings.HasPrefix(f, want) {
			t.Errorf("redrive: %q, want %s", f, want)
		}
	}
	if got := kc.ReadAll(t, "orders.events", 1, 20*time.Second); len(got) != 1 || string(got[0].Key) != "o1" {
		t.Fatalf("orders.events: %v", got)
	}
	if recs, err := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...)).List(context.Background(), "orders.events", 0); err != nil || len(recs) != 1 {
		t.Errorf("orders.events holds %d records, want 1: %v", len(recs), err)
	}
	var actor, moved string
	var n int
	err = db.Pool.QueryRow(context.Background(), `SELECT count(*), min(actor), min(detail->'moved'->0->>'offset') FROM idem_admin_audit
		WHERE action = 'dlq.redrive' AND subject = 'orders.events.dlq' AND reason = 'fixed'`).Scan(&n, &actor, &moved)
	if err != nil || n != 2 || !strings.HasPrefix(actor, "erin (console session ") || moved != "0" {
		t.Errorf("audit rows: %d, actor %q, first moved offset %q: %v", n, actor, moved, err)
	}
}

// IdempotencyHook feeds the keys page with conflicts and mismatches only.
func TestIdempotencyHookRecentEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, "", "")
	hook := b.con.IdempotencyHook()
	ctx := context.Background()
	hook(ctx, idempotency.Event{Kind: idempotency.EventMismatch, Method: "POST", Route: "POST /orders/{id}/confirm"})
	hook(ctx, idempotency.Event{Kind: idempotency.EventReplay, Method: "POST", Route: "POST /replayed"})
	hook(ctx, idempotency.Event{Kind: idempotency.EventConflict, Method: "POST", Route: "POST /payments"})
	_, body, _ := get(t, client(t), b.srv.URL+"/keys")
	if !strings.Contains(body, "mismatch") || !strings.Contains(body, "POST /payments") || strings.Contains(body, "/replayed") {
		t.Errorf("keys page:\n%s", body)
	}
}

type fetchCounter struct{ records atomic.Int64 }

func (f *fetchCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	f.records.Add(int64(m.NumRecords))
}

// The dead-letter page shows the newest 200 records of a topic and reads
// only those from the broker, not the whole topic.
func TestDeadLetterPageReadsNewest(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	kc := testkafka.New(t)
	kc.CreateTopic(t, "big.dlq", 1)
	cl := kc.Client(t)
	const total = 260
	for range total { // one batch per record, as the dead-letter producer writes
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "big.dlq", Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var fc fetchCounter
	con, err := console.New(db.Pool, &console.Config{DLQ: kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...), kgo.WithHooks(&fc)),
		DeadLetterTopics: []string{"big.dlq"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	code, body, _ := get(t, client(t), srv.URL+"/dlq")
	if code != 200 || !strings.Contains(body, "<td>0/259</td>") || !strings.Contains(body, "<td>0/60</td>") || strings.Contains(body, "<td>0/59</td>") {
		t.Fatalf("dlq page %d: want records 0/60 to 0/259", code)
	}
	if n := fc.records.Load(); n >= total {
		t.Errorf("the page fetched %d of the topic's %d records", n, total)
	}
}
