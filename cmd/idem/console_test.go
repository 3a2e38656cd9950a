package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkit/idem/outbox"
)

const consoleToken = "test-console-token-0123456789"

// consoleProc is a running `idem console`.
type consoleProc struct {
	url    string
	stderr *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startConsole(t *testing.T, env []string, args ...string) *consoleProc {
	t.Helper()
	cmd := exec.Command(idemBin, append([]string{"console"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &consoleProc{stderr: &syncBuffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "idem console listening on "); ok {
				u, _, _ := strings.Cut(rest, " ")
				select {
				case line <- strings.TrimSuffix(u, "/"):
				default:
				}
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case p.url = <-line:
	case err := <-exited:
		exited <- err
		t.Fatalf("console exited before listening: %v: %s", err, p.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("console did not print its address: %s", p.stderr.String())
	}
	return p
}

func TestConsoleBadInput(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		env      []string
		args     []string
		wantCode int
		wantErr  string
	}{
		{nil, []string{"console", "--addr", "0.0.0.0:0"}, 2, "set IDEM_CONSOLE_TOKEN"},
		{nil, []string{"console", "--addr", "nonsense"}, 2, "--addr"},
		{[]string{"IDEM_CONSOLE_TOKEN=short"}, []string{"console"}, 2, "shorter than 16"},
		{nil, []string{"console", "--sample-interval", "0s"}, 2, "--sample-interval"},
		{nil, []string{"console", "--session-ttl", "0s"}, 2, "--session-ttl"},
		{nil, []string{"console", "--dlq-topics", "x.dlq"}, 2, "needs KAFKA_BROKERS"},
		{nil, []string{"console", "extra"}, 2, "unexpected argument"},
	}
	for _, tt := range testCases {
		_, stderr, code := runIdem(t, append([]string{"KAFKA_BROKERS="}, tt.env...), tt.args...)
		if code != tt.wantCode || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
			t.Errorf("%v: exit %d (want %d), stderr %q (want one line with %q)", tt.args, code, tt.wantCode, stderr, tt.wantErr)
		}
	}
}

// The operator's path in a real browser: sign in with the token, see the
// DEAD event with its error, click requeue; the event is PENDING and the
// relay publishes it (and the event it held back) to Kafka. Requests
// without the token, or without the CSRF field, are refused.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	db, env := deadSetup(t)
	p := startConsole(t, append(env, "IDEM_CONSOLE_TOKEN="+consoleToken), "--addr", "127.0.0.1:0", "--sample-interval", "100ms")

	// Refusals, over plain HTTP.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, auth string, form url.Values) int {
		req, _ := http.NewRequest(method, p.url+path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := do("POST", "/outbox/requeue", "", url.Values{"id": {"a-1"}}); code != http.StatusUnauthorized {
		t.Errorf("requeue without token: %d, want 401", code)
	}
	if code := do("POST", "/outbox/requeue", "wrong-token-wrong-token", url.Values{"id": {"a-1"}}); code != http.StatusUnauthorized {
		t.Errorf("requeue with a wrong token: %d, want 401", code)
	}
	if code := do("POST", "/outbox/requeue", consoleToken, url.Values{"id": {"a-1"}}); code != http.StatusForbidden {
		t.Errorf("requeue with the token but no CSRF field: %d, want 403", code)
	}
	if code := do("POST", "/outbox/requeue", consoleToken, url.Values{"id": {"a-1"}, "csrf": {"deadbeef"}}); code != http.StatusForbidden {
		t.Errorf("requeue with a forged CSRF field: %d, want 403", code)
	}
	if code := do("GET", "/outbox", "", nil); code != http.StatusSeeOther {
		t.Errorf("page without token: %d, want a redirect to the login", code)
	}
	if e, err := outbox.NewAdmin(db.Pool).Show(context.Background(), "a-1"); err != nil || e.Status != "DEAD" {
		t.Fatalf("refused requests changed a-1: %+v %v", e, err)
	}

	// The browser.
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900),
		chromedp.Flag("no-proxy-server", true))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	bctx, tcancel := context.WithTimeout(bctx, 2*time.Minute)
	defer tcancel()

	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	err := chromedp.Do(bctx,
		chromedp.Navigate(p.url+"/outbox"), // redirected to the login form
		chromedp.WaitVisible(css(`#token`)),
		chromedp.SendKeys(css(`#name`), "erin"),
		chromedp.SendKeys(css(`#token`), consoleToken),
		chromedp.Click(css(`#signin`)),
		chromedp.WaitVisible(css(`#dead-a-1`)),
	)
	if err != nil {
		t.Fatalf("browser: %v\nconsole stderr:\n%s", err, p.stderr.String())
	}
	deadRow, err := chromedp.Run(bctx, chromedp.Text(css(`#dead-a-1`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(deadRow, "MESSAGE_TOO_LARGE") || !strings.Contains(deadRow, `"order_id": "a"`) || !strings.Contains(deadRow, "DEAD") {
		t.Errorf("dead row: %q", deadRow)
	}
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveScreenshot(t, shot)

	err = chromedp.Do(bctx,
		chromedp.SendKeys(css(`#dead-a-1 input[name=reason]`), "max.message.bytes raised"),
		chromedp.Click(css(`#requeue-a-1`)),
		chromedp.WaitVisible(css(`#flash`)),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	flash, err := chromedp.Run(bctx, chromedp.Text(css(`#flash`)))
	if err != nil {
		t.Fatal(err)
	}
	countDead, err := chromedp.Run(bctx, chromedp.Text(css(`#count-dead`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(flash, "requeued a-1") || countDead != "0" {
		t.Errorf("after the click: flash %q, dead count %q", flash, countDead)
	}
	e, err := outbox.NewAdmin(db.Pool).Show(context.Background(), "a-1")
	if err != nil || e.Status != "PENDING" || len(e.Audit) != 1 || !strings.HasPrefix(e.Audit[0].Actor, "erin (console session ") ||
		e.Audit[0].Reason != "max.message.bytes raised" {
		t.Fatalf("after the click: %+v %v", e, err)
	}
	if !strings.Contains(p.stderr.String(), "console: action") || !strings.Contains(p.stderr.String(), "action=requeue") {
		t.Errorf("the action is not logged:\n%s", p.stderr.String())
	}

	if got := relayToKafka(t, db, 2); !slices.Equal(got, []string{"a-1", "a-2"}) {
		t.Fatalf("published %v, want a-1 a-2", got)
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(p.url+"/outbox/event?id=a-1"), chromedp.WaitVisible(css(`#event-status`))); err != nil {
		t.Fatal(err)
	}
	if status, err := chromedp.Run(bctx, chromedp.Text(css(`#event-status`))); err != nil || status != "PUBLISHED" {
		t.Errorf("event page after the relay: %q %v", status, err)
	}
	bcancel()
	acancel()
}

// saveScreenshot writes the page as an artifact: to IDEM_CONSOLE_SCREENSHOT
// when set (docs/console.png is made that way), else to the temp dir.
func saveScreenshot(t *testing.T, png []byte) {
	t.Helper()
	path := os.Getenv("IDEM_CONSOLE_SCREENSHOT")
	if path == "" {
		path = filepath.Join(os.TempDir(), "idem-console-screenshot.png")
	}
	if len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Fatalf("screenshot is not a PNG (%d bytes)", len(png))
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// Without IDEM_CONSOLE_TOKEN the console still needs a token: it makes a
// random one, prints it once on stderr with a sign-in link, and refuses
// every request without it (on main a tokenless console served any local
// user).
func TestConsoleGeneratesToken(t *testing.T) {
	t.Parallel()
	_, env := deadSetup(t)
	p := startConsole(t, append(env, "IDEM_CONSOLE_TOKEN="), "--addr", "127.0.0.1:0")
	tokenRe := regexp.MustCompile(`this run's token is ([0-9a-f]{48})\n\s+sign in at (http://\S+/login\?token=[0-9a-f]{48})`)
	var m []string
	for deadline := time.Now().Add(20 * time.Second); m == nil; {
		if m = tokenRe.FindStringSubmatch(p.stderr.String()); m == nil && time.Now().After(deadline) {
			t.Fatalf("no token printed:\n%s", p.stderr.String())
		}
		if m == nil {
			time.Sleep(10 * time.Millisecond) // polling the child's stderr
		}
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path, token string) int {
		req, _ := http.NewRequest(http.MethodGet, p.url+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/outbox", ""); code != http.StatusSeeOther {
		t.Errorf("page without the token: %d, want a redirect to the login", code)
	}
	if code := get("/outbox", m[1]); code != http.StatusOK {
		t.Errorf("page with the printed token: %d", code)
	}
	if !strings.HasPrefix(m[2], p.url+"/login?token=") {
		t.Errorf("sign-in link %s, console at %s", m[2], p.url)
	}
	if strings.Count(p.stderr.String(), m[1]) != 2 { // the token and the link, once
		t.Errorf("the token is printed %d times", strings.Count(p.stderr.String(), m[1]))
	}
}
