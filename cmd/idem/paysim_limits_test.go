package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testbin"
)

// The tests of this file hold `idem paysim` to its limits as an anonymous
// client over real TCP would probe them: every limit is set through the
// environment (so that a binary without the limit still starts, and the
// test fails on what it does rather than on a flag it lacks), memory is the
// child's resident set read from /proc, and no assertion is about time: a
// deadline only bounds how long a test waits for a condition.

const ledgerToken = "ledger-token-for-tests-0123456789"

type answer struct {
	status int
	header http.Header
	body   []byte
	code   string // the problem's code member, if any
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s %.200s", a.status, a.header.Get("Content-Type"), a.body)
}

// do sends one request and reads the whole answer.
func do(hc *http.Client, method, url, body string, header map[string]string) (answer, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: b}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		var p struct {
			Code string `json:"code"`
		}
		if err := json.Unmarshal(b, &p); err != nil {
			return a, fmt.Errorf("problem %q: %v", b, err)
		}
		a.code = p.Code
	}
	return a, nil
}

func chargeJSON(order, customer string, amount int64) string {
	b, _ := json.Marshal(map[string]any{"order_id": order, "customer_id": customer, "amount_kopecks": amount})
	return string(b)
}

// ledgerEntry is one charge or decline of GET /ledger, as a client reads it.
type ledgerEntry struct {
	ChargeID       string `json:"charge_id"`
	DeclineID      string `json:"decline_id"`
	IdempotencyKey string `json:"idempotency_key"`
	OrderID        string `json:"order_id"`
	Principal      string `json:"principal"`
}

type ledgerPage struct {
	Charges  []ledgerEntry `json:"charges"`
	Declines []ledgerEntry `json:"declines"`
	Next     string        `json:"next"`
}

func getLedger(t *testing.T, hc *http.Client, url string, header map[string]string) ledgerPage {
	t.Helper()
	a, err := do(hc, "GET", url, "", header)
	if err != nil || a.status != 200 {
		t.Fatalf("GET %s: %v %v", url, a, err)
	}
	var p ledgerPage
	if err := json.Unmarshal(a.body, &p); err != nil || p.Charges == nil || p.Declines == nil {
		t.Fatalf("GET %s = %.300s: %v", url, a.body, err)
	}
	return p
}

// TestPaysimDefaultAddressIsLoopback: without --addr or PAYSIM_ADDR,
// paysim listens on 127.0.0.1:8090, not on every interface. Port 8090 may
// be taken on this machine: then the refusal names the address it tried.
func TestPaysimDefaultAddressIsLoopback(t *testing.T) {
	t.Parallel()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYSIM_ADDR=") {
			env = append(env, kv)
		}
	}
	cmd := exec.Command(idemBin, "paysim")
	cmd.Env = env
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		line := ""
		if sc.Scan() {
			line = sc.Text()
		}
		first <- line
		io.Copy(io.Discard, out)
	}()
	var line string
	select {
	case line = <-first:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("paysim printed nothing in 30s")
	}
	_ = cmd.Process.Signal(os.Interrupt)
	waitErr := cmd.Wait()
	if a, ok := strings.CutPrefix(line, "paysim listening on "); ok {
		if a != "127.0.0.1:8090" {
			t.Fatalf("default address %s, want 127.0.0.1:8090", a)
		}
		return
	}
	// The port is in use: the error says which address was meant.
	if waitErr == nil || !strings.Contains(stderr.String(), "127.0.0.1:8090") {
		t.Fatalf("paysim without --addr: stdout %q, exit %v, stderr %q; want it on 127.0.0.1:8090", line, waitErr, stderr.String())
	}
}

// TestPaysimWarnsOnNonLoopbackAddress: an address that is not loopback is
// an explicit choice, and paysim says on stderr what it exposes.
func TestPaysimWarnsOnNonLoopbackAddress(t *testing.T) {
	t.Parallel()
	p := startPaysimAt(t, "0.0.0.0:0", nil)
	p.waitLog(t, "not a loopback address")
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	// Loopback: no warning.
	q := startPaysim(t, nil)
	if _, err := q.stop(t); err != nil {
		t.Fatal(err)
	}
	if s := q.stderrText(); strings.Contains(s, "loopback") {
		t.Fatalf("a loopback address got a warning: %q", s)
	}
}

// TestPaysimRefusesOversizeFields: order ids, customer ids, keys and
// principals have bounded sizes; a 60 KB order id (the size that grew the
// process by 880 MB in 3 s) is a 400 problem naming the field, never a
// charge, and a stream of them does not grow the process.
func TestPaysimRefusesOversizeFields(t *testing.T) {
	t.Parallel()
	p := startPaysim(t, []string{"PAYSIM_LEDGER_TOKEN=" + ledgerToken})
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	huge := strings.Repeat("o", 60<<10)
	testCases := []struct {
		name     string
		body     string
		header   map[string]string
		wantCode string
	}{
		{"60 KB order id", chargeJSON(huge, "c", 1), nil, "FIELD_TOO_LONG"},
		{"60 KB customer id", chargeJSON("o", huge, 1), nil, "FIELD_TOO_LONG"},
		{"256-byte order id", chargeJSON(strings.Repeat("o", 256), "c", 1), nil, "FIELD_TOO_LONG"},
		{"2 KB principal", chargeJSON("o", "c", 1), map[string]string{"Authorization": "Bearer " + strings.Repeat("p", 2048)}, "FIELD_TOO_LONG"},
		{"256-byte key", chargeJSON("o", "c", 1), map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, "IDEMPOTENCY_KEY_INVALID"},
	}
	for i, tt := range testCases {
		h := map[string]string{"Idempotency-Key": fmt.Sprintf("oversize-%d", i)}
		for k, v := range tt.header {
			h[k] = v
		}
		a, err := do(hc, "POST", p.url+"/charges", tt.body, h)
		if err != nil || a.status != 400 || a.code != tt.wantCode {
			t.Errorf("%s: %v %v; want 400 %s", tt.name, a, err, tt.wantCode)
		}
		if strings.Contains(string(a.body), "oooooooooooooooooooooooooooooooooooooooooooo") {
			t.Errorf("%s: the answer echoes the field: %.200s", tt.name, a.body)
		}
	}
	// 255 bytes is within bounds.
	if a, err := do(hc, "POST", p.url+"/charges", chargeJSON(strings.Repeat("o", 255), "c", 1), map[string]string{"Idempotency-Key": "at-the-bound"}); err != nil || a.status != 201 {
		t.Fatalf("255-byte order id: %v %v, want 201", a, err)
	}

	before := testbin.RSS(t, p.cmd.Process.Pid)
	var wg sync.WaitGroup
	var bad atomic.Int64
	for w := range 8 {
		wg.Go(func() {
			for i := range 100 {
				a, err := do(hc, "POST", p.url+"/charges", chargeJSON(fmt.Sprintf("%d-%d-%s", w, i, huge), "c", 1),
					map[string]string{"Idempotency-Key": fmt.Sprintf("huge-%d-%d", w, i)})
				if err != nil || a.status != 400 || a.code != "FIELD_TOO_LONG" {
					if bad.Add(1) == 1 {
						t.Errorf("60 KB order id: %v %v", a, err)
					}
				}
			}
		})
	}
	wg.Wait()
	growth := testbin.RSS(t, p.cmd.Process.Pid) - before
	l := getLedger(t, hc, p.url+"/ledger", map[string]string{"Authorization": "Bearer " + ledgerToken})
	if len(l.Charges) != 1 || len(l.Declines) != 0 {
		t.Fatalf("ledger after oversize input: %d charges, %d declines; want only the 255-byte one", len(l.Charges), len(l.Declines))
	}
	// 800 refused requests of 60 KB each are 48 MB on the wire; what
	// stays must be a small fraction of that.
	if growth > 24<<20 {
		t.Fatalf("800 refused 60 KB order ids grew paysim by %d MiB", growth>>20)
	}
	t.Logf("800 refused 60 KB order ids: RSS %+d KiB", growth>>10)
}

// TestPaysimLedgerCapUnderLoad: one client charging as fast as it can
// (the 24,000 charges/s) fills the ledger's byte budget, and from
// then on every new key is a clear 507 LEDGER_FULL, nothing charged: the
// process stops growing, every 201 is in the ledger, and a retry of a key
// charged before the cap still gets its charge.
func TestPaysimLedgerCapUnderLoad(t *testing.T) {
	t.Parallel()
	const budget = 4 << 20
	p := startPaysim(t, []string{"PAYSIM_MAX_LEDGER_BYTES=" + strconv.Itoa(budget), "PAYSIM_LEDGER_TOKEN=" + ledgerToken})
	tr := &http.Transport{MaxIdleConnsPerHost: 16, MaxConnsPerHost: 16}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	// Fields at their bounds: the most memory per charge a client can ask
	// for.
	pad := strings.Repeat("x", 200)
	principal := "Bearer " + strings.Repeat("m", 1000)
	charge := func(i int) (answer, error) {
		return do(hc, "POST", p.url+"/charges", chargeJSON(fmt.Sprintf("o-%06d-%s", i, pad), fmt.Sprintf("c-%06d-%s", i, pad), 100),
			map[string]string{"Idempotency-Key": fmt.Sprintf("k-%06d-%s", i, pad), "Authorization": principal})
	}
	if a, err := charge(-1); err != nil || a.status != 201 {
		t.Fatalf("first charge: %v %v", a, err)
	}
	before := testbin.RSS(t, p.cmd.Process.Pid)

	const n = 16000
	var next, created, full atomic.Int64
	var firstFull atomic.Int64
	firstFull.Store(-1)
	var wg sync.WaitGroup
	start := time.Now()
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				a, err := charge(i)
				switch {
				case err != nil:
					t.Errorf("charge %d: %v", i, err)
					return
				case a.status == 201:
					created.Add(1)
				case a.status == 507 && a.code == "LEDGER_FULL":
					full.Add(1)
					firstFull.CompareAndSwap(-1, int64(i))
				default:
					t.Errorf("charge %d: %v, want 201 or 507 LEDGER_FULL", i, a)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if t.Failed() {
		return
	}
	growth := testbin.RSS(t, p.cmd.Process.Pid) - before
	t.Logf("%d charges in %v (%.0f/s): %d created, %d LEDGER_FULL (first at #%d); RSS %+d MiB with a %d MiB budget",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), created.Load(), full.Load(), firstFull.Load(), growth>>20, budget>>20)
	if full.Load() == 0 || created.Load() == 0 {
		t.Fatalf("%d created, %d refused as LEDGER_FULL: the cap was never reached", created.Load(), full.Load())
	}
	// Generous: the heap may hold twice what is live between collections,
	// and the budget is an estimate of what is live.
	if growth > 4*budget+16<<20 {
		t.Fatalf("RSS grew by %d MiB with a %d MiB ledger budget", growth>>20, budget>>20)
	}
	// No silent drop: every 201 is in the ledger (the first charge too).
	var rows int
	for after := ""; ; {
		l := getLedger(t, hc, p.url+"/ledger?limit=1000&after="+after, map[string]string{"Authorization": "Bearer " + ledgerToken})
		rows += len(l.Charges)
		if l.Next == "" {
			break
		}
		after = l.Next
	}
	if rows != int(created.Load())+1 {
		t.Fatalf("%d charges in the ledger, %d answered 201", rows, created.Load()+1)
	}
	// A key charged before the cap still gets its charge, not a refusal.
	if a, err := charge(-1); err != nil || a.status != 201 {
		t.Fatalf("retry of a charged key on a full ledger: %v %v, want its 201", a, err)
	}
	if a, err := do(hc, "GET", p.url+"/metrics", "", nil); err != nil || !strings.Contains(string(a.body), "paysim_ledger_full_total "+strconv.FormatInt(full.Load(), 10)+"\n") {
		t.Errorf("GET /metrics lacks paysim_ledger_full_total %d: %v %v", full.Load(), a, err)
	}
}

// TestPaysimLedgerPagesAndScope: GET /ledger pages with ?after=&limit=,
// keeping the contract's shape ({"charges","declines"} plus "next" while
// more remain); without parameters it is the whole view. A principal sees
// only its own entries; PAYSIM_LEDGER_TOKEN sees every principal's.
func TestPaysimLedgerPagesAndScope(t *testing.T) {
	t.Parallel()
	p := startPaysim(t, []string{"PAYSIM_LEDGER_TOKEN=" + ledgerToken}, "--decline-rate", "0.3", "--seed", "5")
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	principals := map[string]int{"Bearer alice": 25, "Bearer bob": 5, "": 3}
	for who, n := range principals {
		for i := range n {
			h := map[string]string{"Idempotency-Key": fmt.Sprintf("k-%d", i)} // the same keys for everyone
			if who != "" {
				h["Authorization"] = who
			}
			a, err := do(hc, "POST", p.url+"/charges", chargeJSON(fmt.Sprintf("%s-o-%d", who, i), "c", 10), h)
			if err != nil || (a.status != 201 && a.status != 402) {
				t.Fatalf("charge %s %d: %v %v", who, i, a, err)
			}
		}
	}
	admin := map[string]string{"Authorization": "Bearer " + ledgerToken}
	// pages walks a view with limit and returns the entries in order.
	pages := func(header map[string]string, limit int) (entries []ledgerEntry, npages int) {
		after := ""
		for {
			l := getLedger(t, hc, fmt.Sprintf("%s/ledger?limit=%d&after=%s", p.url, limit, after), header)
			if got := len(l.Charges) + len(l.Declines); got > limit || (l.Next != "" && got != limit) {
				t.Fatalf("page after %q: %d entries with limit %d, next %q", after, got, limit, l.Next)
			}
			entries = append(append(entries, l.Charges...), l.Declines...)
			npages++
			if l.Next == "" {
				return entries, npages
			}
			after = l.Next
		}
	}
	whole := func(header map[string]string) []ledgerEntry {
		l := getLedger(t, hc, p.url+"/ledger", header)
		if l.Next != "" {
			t.Fatalf("GET /ledger without parameters has next %q", l.Next)
		}
		return append(l.Charges, l.Declines...)
	}
	ids := func(es []ledgerEntry) map[string]bool {
		m := map[string]bool{}
		for _, e := range es {
			id := e.ChargeID + e.DeclineID
			if m[id] {
				t.Fatalf("entry %s twice", id)
			}
			m[id] = true
		}
		return m
	}
	for who, n := range principals {
		h := map[string]string{}
		want := "paysim"
		if who != "" {
			h["Authorization"], want = who, who
		}
		all := whole(h)
		paged, np := pages(h, 10)
		if len(all) != n || len(paged) != n || np != (n+9)/10 {
			t.Fatalf("%q: %d entries whole, %d in %d pages of 10; want %d", who, len(all), len(paged), np, n)
		}
		a, b := ids(all), ids(paged)
		for id := range a {
			if !b[id] {
				t.Fatalf("%q: %s is in the whole view but in no page", who, id)
			}
		}
		for _, e := range all {
			if e.Principal != want || e.IdempotencyKey == "" {
				t.Fatalf("%q sees %+v", who, e)
			}
		}
	}
	total := 25 + 5 + 3
	if all, paged := whole(admin), func() []ledgerEntry { e, _ := pages(admin, 7); return e }(); len(all) != total || len(ids(paged)) != total {
		t.Fatalf("ledger token: %d entries whole, %d paged; want %d", len(all), len(paged), total)
	}
	declines := 0
	for _, e := range whole(admin) {
		if e.DeclineID != "" {
			declines++
		}
	}
	if declines == 0 || declines == total {
		t.Fatalf("%d of %d declined at rate 0.3: pages never mixed charges and declines", declines, total)
	}
	// A wrong token is just another principal, with nothing charged.
	if l := whole(map[string]string{"Authorization": "Bearer " + ledgerToken + "x"}); len(l) != 0 {
		t.Fatalf("a wrong token sees %d entries", len(l))
	}
	for _, q := range []string{"limit=0", "limit=-1", "limit=ten", "limit=100001", "after=-1", "after=x", "after=1&after=2", "limit=1&limit=2"} {
		a, err := do(hc, "GET", p.url+"/ledger?"+q, "", admin)
		if err != nil || a.status != 400 || a.code != "INVALID_PAGE" {
			t.Errorf("GET /ledger?%s: %v %v, want 400 INVALID_PAGE", q, a, err)
		}
	}
	// Past the end: an empty page, no next.
	if l := getLedger(t, hc, p.url+"/ledger?after=1000", admin); len(l.Charges)+len(l.Declines) != 0 || l.Next != "" {
		t.Fatalf("page after the end: %+v", l)
	}
}

// rawConn is one TCP connection to paysim, for requests net/http would not
// send.
type rawConn struct {
	net.Conn
}

func dialRaw(t *testing.T, url string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{c}
}

// readUntilClosed reads until the server closes the connection, and
// returns what arrived. Only the wait is bounded (30 s, far above every
// timeout the tests configure): a connection still open then fails t.
func (c *rawConn) readUntilClosed(t *testing.T, what string) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the connection is still open after 30s (got %q)", what, b)
	}
	return string(b)
}

// TestPaysimSlowAndIdleConnectionsClosed: a body that never arrives, a
// slow chunked body, a keep-alive connection left idle and a header that
// never ends are each closed at the configured timeout instead of held
// forever.
func TestPaysimSlowAndIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	p := startPaysim(t, []string{"PAYSIM_READ_TIMEOUT=1s", "PAYSIM_READ_HEADER_TIMEOUT=1s", "PAYSIM_IDLE_TIMEOUT=1s"})

	t.Run("body never arrives", func(t *testing.T) {
		t.Parallel()
		c := dialRaw(t, p.url)
		fmt.Fprintf(c, "POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow-1\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"order_id\":")
		got := c.readUntilClosed(t, "a body that never arrives")
		if got != "" && !strings.HasPrefix(got, "HTTP/1.1 400") {
			t.Fatalf("answer to a body cut by the read timeout: %q", got)
		}
	})
	t.Run("slow chunked body", func(t *testing.T) {
		t.Parallel()
		c := dialRaw(t, p.url)
		fmt.Fprintf(c, "POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow-2\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
		stop := make(chan struct{})
		writerDone := make(chan struct{})
		go func() {
			defer close(writerDone)
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := io.WriteString(c, "1\r\n \r\n"); err != nil {
						return
					}
				}
			}
		}()
		got := c.readUntilClosed(t, "a slow chunked body")
		close(stop)
		<-writerDone
		if got != "" && !strings.HasPrefix(got, "HTTP/1.1 400") {
			t.Fatalf("answer to a slow chunked body: %q", got)
		}
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		t.Parallel()
		c := dialRaw(t, p.url)
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		got := c.readUntilClosed(t, "an idle keep-alive connection")
		if !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("GET /healthz: %q", got)
		}
	})
	t.Run("header never ends", func(t *testing.T) {
		t.Parallel()
		c := dialRaw(t, p.url)
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
		c.readUntilClosed(t, "a header that never ends")
	})
}

// TestPaysimAnswersBeforeTheBody: a POST that will be refused whatever its
// body (no Idempotency-Key, an over-long principal) is answered at once
// and the connection closed, without waiting for a body that may never
// come. The read timeout is an hour here: an answer that waited for the
// body would not come within the test's wait.
func TestPaysimAnswersBeforeTheBody(t *testing.T) {
	t.Parallel()
	p := startPaysim(t, []string{"PAYSIM_READ_TIMEOUT=1h", "PAYSIM_WRITE_TIMEOUT=2h"})
	for _, tt := range []struct {
		name, header, want string
	}{
		{"no key", "", "IDEMPOTENCY_KEY_REQUIRED"},
		{"invalid key", "Idempotency-Key: a b\r\n", "IDEMPOTENCY_KEY_INVALID"},
		{"over-long principal", "Idempotency-Key: k\r\nAuthorization: Bearer " + strings.Repeat("p", 2000) + "\r\n", "FIELD_TOO_LONG"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := dialRaw(t, p.url)
			fmt.Fprintf(c, "POST /charges HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n", tt.header)
			got := c.readUntilClosed(t, tt.name)
			if !strings.HasPrefix(got, "HTTP/1.1 400") || !strings.Contains(got, `"code":"`+tt.want+`"`) {
				t.Fatalf("answer %q, want 400 %s", got, tt.want)
			}
		})
	}
}

// TestPaysimConnectionLimit: beyond PAYSIM_MAX_CONNS open connections a
// new one is answered 503 TOO_MANY_CONNECTIONS (with Retry-After) and
// closed; once a connection closes, a new one is served again.
func TestPaysimConnectionLimit(t *testing.T) {
	t.Parallel()
	p := startPaysim(t, []string{"PAYSIM_MAX_CONNS=4", "PAYSIM_READ_HEADER_TIMEOUT=1h", "PAYSIM_READ_TIMEOUT=1h", "PAYSIM_WRITE_TIMEOUT=2h"})
	held := make([]*rawConn, 4)
	for i := range held {
		held[i] = dialRaw(t, p.url)
		// A header that never ends keeps the connection busy.
		fmt.Fprintf(held[i], "GET /healthz HTTP/1.1\r\nHost: x\r\n")
	}
	// The server accepts in order, so the fifth connection is over the
	// limit once the four before it are accepted.
	c := dialRaw(t, p.url)
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	got := c.readUntilClosed(t, "a connection over the limit")
	if !strings.HasPrefix(got, "HTTP/1.1 503") || !strings.Contains(got, `"code":"TOO_MANY_CONNECTIONS"`) || !strings.Contains(got, "Retry-After:") {
		t.Fatalf("a connection over the limit got %q, want 503 TOO_MANY_CONNECTIONS with Retry-After", got)
	}
	// net/http reads it as an answer too.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if a, err := do(hc, "GET", p.url+"/healthz", "", nil); err != nil || a.status != 503 || a.code != "TOO_MANY_CONNECTIONS" {
		t.Fatalf("net/http over the limit: %v %v", a, err)
	}
	held[0].Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := do(hc, "GET", p.url+"/metrics", "", nil)
		if err == nil && a.status == 200 {
			if !strings.Contains(string(a.body), "paysim_connections_refused_total ") || strings.Contains(string(a.body), "paysim_connections_refused_total 0\n") {
				t.Fatalf("GET /metrics does not count the refused connections:\n%s", a.body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection served 30s after one of the four closed: %v %v", a, err)
		}
		time.Sleep(20 * time.Millisecond) // polling for a slot, not waiting for a fixed time
	}
}
