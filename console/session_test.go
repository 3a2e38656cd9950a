package console_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/console"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func signIn(t *testing.T, c *http.Client, base, token, name string) http.Header {
	t.Helper()
	_, body, _ := get(t, c, base+"/login")
	code, _, hdr := postForm(t, c, base+"/login", url.Values{"token": {token}, "name": {name}, "csrf": {csrfOf(t, body)}})
	if code != http.StatusSeeOther || !strings.HasSuffix(hdr.Get("Location"), "/outbox") {
		t.Fatalf("sign in: %d %v", code, hdr)
	}
	return hdr
}

func sessionCookie(t *testing.T, hdr http.Header) *http.Cookie {
	t.Helper()
	for _, v := range hdr.Values("Set-Cookie") {
		ck, err := http.ParseSetCookie(v)
		if err == nil && strings.HasSuffix(ck.Name, "idem_console_session") {
			return ck
		}
	}
	t.Fatalf("no session cookie in %v", hdr.Values("Set-Cookie"))
	return nil
}

// The session cookie is a random id, not the token; it expires; sign-out
// and RevokeSessions end it on the server (the old cookie no longer gets
// in); over plain HTTP it is not Secure and has no __Host- prefix.
func TestSessionCookie(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token-0123456789"
	b := setup(t, token, "")
	c := client(t)
	hdr := signIn(t, c, b.srv.URL, token, "alice")
	ck := sessionCookie(t, hdr)
	if ck.Name != "idem_console_session" || ck.Secure || ck.Value == token || strings.Contains(ck.Value, token) || len(ck.Value) < 32 || ck.MaxAge <= 0 || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("session cookie %+v", ck)
	}
	code, body, _ := get(t, c, b.srv.URL+"/outbox")
	if code != 200 || !strings.Contains(body, `id="signout"`) {
		t.Fatalf("signed in: %d", code)
	}
	// A stolen copy of the cookie works until sign-out, not after.
	thief := client(t)
	u, _ := url.Parse(b.srv.URL)
	thief.Jar.SetCookies(u, []*http.Cookie{{Name: ck.Name, Value: ck.Value}})
	if code, _, _ := get(t, thief, b.srv.URL+"/outbox"); code != 200 {
		t.Fatalf("the session's cookie: %d", code)
	}
	if code, _, _ := postForm(t, c, b.srv.URL+"/logout", url.Values{"csrf": {csrfOf(t, body)}}); code != http.StatusSeeOther {
		t.Fatalf("sign out: %d", code)
	}
	for _, cl := range []*http.Client{c, thief} {
		if code, _, hdr := get(t, cl, b.srv.URL+"/outbox"); code != http.StatusSeeOther || !strings.HasSuffix(hdr.Get("Location"), "/login") {
			t.Errorf("after sign out: %d %v", code, hdr)
		}
	}
	signIn(t, c, b.srv.URL, token, "alice")
	if b.con.Sessions() != 1 {
		t.Errorf("sessions %d, want 1", b.con.Sessions())
	}
	b.con.RevokeSessions()
	if code, _, _ := get(t, c, b.srv.URL+"/outbox"); code != http.StatusSeeOther {
		t.Errorf("after RevokeSessions: %d", code)
	}
}

// A session ends at SessionTTL.
func TestSessionExpires(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token-0123456789"
	db := testdb.New(t)
	con, err := console.New(db.Pool, &console.Config{Token: token, SessionTTL: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	ck := sessionCookie(t, signIn(t, client(t), srv.URL, token, "bob"))
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		// The cookie is sent by hand: the server's own expiry is tested,
		// not the browser's.
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/outbox", nil)
		req.AddCookie(&http.Cookie{Name: ck.Name, Value: ck.Value})
		resp, err := client(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusSeeOther {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the session outlived its TTL")
		}
		<-tick.C
	}
	if con.Sessions() != 0 {
		t.Errorf("sessions after expiry: %d", con.Sessions())
	}
}

// Over TLS, and behind a trusted proxy that says https, the cookies are
// Secure and named __Host-; a proxy header from an untrusted peer changes
// nothing.
func TestSessionCookieSecure(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token-0123456789"
	db := testdb.New(t)
	for _, tc := range []struct {
		name    string
		tls     bool
		proxies []netip.Prefix
		xfp     string
		secure  bool
	}{
		{"direct TLS", true, nil, "", true},
		{"trusted proxy says https", false, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, "https", true},
		{"untrusted peer says https", false, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "https", false},
		{"no proxy configured", false, nil, "https", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			con, err := console.New(db.Pool, &console.Config{Token: token, TrustedProxies: tc.proxies, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			var srv *httptest.Server
			if tc.tls {
				srv = httptest.NewTLSServer(con)
			} else {
				srv = httptest.NewServer(con)
			}
			defer srv.Close()
			c := srv.Client()
			c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
			if tr, ok := c.Transport.(*http.Transport); ok && tc.tls {
				tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test server's own certificate
			}
			send := func(method, path string, form url.Values, cookies []*http.Cookie) *http.Response {
				req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(form.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				if tc.xfp != "" {
					req.Header.Set("X-Forwarded-Proto", tc.xfp)
				}
				for _, ck := range cookies {
					req.AddCookie(ck)
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var buf bytes.Buffer
				_, _ = buf.ReadFrom(resp.Body)
				resp.Body = http.NoBody
				if m := csrfRe.FindStringSubmatch(buf.String()); m != nil {
					resp.Header.Set("X-Test-CSRF", m[1])
				}
				return resp
			}
			page := send(http.MethodGet, "/login", nil, nil)
			csrf := page.Cookies()
			if len(csrf) != 1 || csrf[0].Secure != tc.secure || strings.HasPrefix(csrf[0].Name, "__Host-") != tc.secure {
				t.Fatalf("csrf cookie %+v, want secure=%v", csrf, tc.secure)
			}
			resp := send(http.MethodPost, "/login", url.Values{"token": {token}, "name": {"carol"}, "csrf": {page.Header.Get("X-Test-CSRF")}}, csrf)
			ck := sessionCookie(t, resp.Header)
			if ck.Secure != tc.secure || (ck.Name == "__Host-idem_console_session") != tc.secure || ck.Path != "/" || ck.Domain != "" {
				t.Fatalf("session cookie %+v, want secure=%v", ck, tc.secure)
			}
			if got := send(http.MethodGet, "/outbox", nil, []*http.Cookie{ck}); got.StatusCode != 200 {
				t.Fatalf("with the session cookie: %d", got.StatusCode)
			}
		})
	}
}

// A tokenless console (a library mount) refuses a peer that is not
// loopback even when the Host header names loopback.
func TestNoTokenRefusesRemotePeer(t *testing.T) {
	t.Parallel()
	b := setup(t, "", "")
	for _, host := range []string{"127.0.0.1:8099", "localhost"} {
		r := httptest.NewRequest(http.MethodGet, "/outbox", nil)
		r.Host = host
		r.RemoteAddr = "192.0.2.7:40000"
		w := httptest.NewRecorder()
		b.con.ServeHTTP(w, r)
		if w.Code != http.StatusForbidden {
			t.Errorf("peer 192.0.2.7, Host %s: %d, want 403", host, w.Code)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "/outbox", nil)
	r.Host, r.RemoteAddr = "localhost", "127.0.0.1:40000"
	w := httptest.NewRecorder()
	b.con.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Errorf("loopback peer: %d", w.Code)
	}
}

// The banner shows only what the console set: a msg or err in the link,
// or a flash cookie not signed by this process, shows nothing.
func TestBannerOnlyFromTheConsole(t *testing.T) {
	t.Parallel()
	b := setup(t, "", "")
	c := client(t)
	_, body, _ := get(t, c, b.srv.URL+"/outbox?msg=Your+session+expired:+call+555-0100&err=pwned")
	if strings.Contains(body, "555-0100") || strings.Contains(body, "pwned") || strings.Contains(body, `id="flash"`) {
		t.Errorf("a query parameter reached the banner")
	}
	u, _ := url.Parse(b.srv.URL)
	c.Jar.SetCookies(u, []*http.Cookie{{Name: "idem_console_flash", Value: "bWZvcmdlZA.00"}})
	if _, body, _ := get(t, c, b.srv.URL+"/outbox"); strings.Contains(body, "forged") {
		t.Errorf("a forged flash cookie reached the banner")
	}
}

// The console logs a refused request's path clipped, as billing does.
func TestLoggedPathClipped(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	var logs lockedBuf
	con, err := console.New(db.Pool, &console.Config{Token: "s3cret-token-0123456789", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	long := "/" + strings.Repeat("a", 5000)
	r := httptest.NewRequest(http.MethodPost, long, nil)
	w := httptest.NewRecorder()
	con.ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("status %d", w.Code)
	}
	if out := logs.String(); strings.Contains(out, strings.Repeat("a", 200)) || !strings.Contains(out, "request refused") {
		t.Errorf("log line of %d bytes:\n%.300s", len(out), out)
	}
}

// The release form acts on the claim it showed: a retry took the key
// over since, so the release (with the old fence in the form) refuses,
// says so, and leaves the retry's claim alone; the audit row names the
// signed-in session.
func TestReleaseFormUsesFence(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token-0123456789"
	b := setup(t, token, "")
	ctx := context.Background()
	store := idempotency.NewPostgresStore(b.db.Pool)
	key := idempotency.HashKey("alice", "POST", "/orders", "stuck")
	claim := idempotency.Claim{Key: key, Fingerprint: idempotency.Fingerprint{1}, Lease: time.Millisecond, Retention: time.Hour}
	if res, err := store.Claim(ctx, claim); err != nil || res.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	c := client(t)
	signIn(t, c, b.srv.URL, token, "dave")
	q := "/keys?" + url.Values{"principal": {"alice"}, "method": {"POST"}, "route": {"/orders"}, "key": {"stuck"}}.Encode()
	_, page, _ := get(t, c, b.srv.URL+q)
	if !strings.Contains(page, `id="release-form"`) {
		t.Fatalf("no release form:\n%s", page)
	}
	shown, _ := store.Inspect(ctx, key)
	claim.Lease = time.Hour
	var retry idempotency.ClaimResult
	for deadline := time.Now().Add(10 * time.Second); retry.Outcome != idempotency.OutcomeTookOver; {
		if time.Now().After(deadline) {
			t.Fatal("no takeover")
		}
		var err error
		if retry, err = store.Claim(ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	form := url.Values{"principal": {"alice"}, "method": {"POST"}, "route": {"/orders"}, "key": {"stuck"},
		"fence": {fenceOf(t, page)}, "reason": {"stuck"}, "force": {"on"}, "csrf": {csrfOf(t, page)}}
	if form.Get("fence") != strconvI(shown.Fence) {
		t.Fatalf("form fence %s, shown %d", form.Get("fence"), shown.Fence)
	}
	_, _, hdr := postForm(t, c, b.srv.URL+"/keys/release", form)
	if f := flashAt(t, c, b.srv.URL, hdr); !strings.HasPrefix(f, "bad: ") || !strings.Contains(f, "not the one shown") {
		t.Errorf("release with the old fence: %q", f)
	}
	if rec, err := store.Inspect(ctx, key); err != nil || rec.Fence != retry.Fence || !rec.InProgress {
		t.Fatalf("the retry's claim: %+v %v", rec, err)
	}
	_, page, _ = get(t, c, b.srv.URL+q)
	form.Set("fence", fenceOf(t, page))
	form.Del("force")
	_, _, hdr = postForm(t, c, b.srv.URL+"/keys/release", form)
	if f := flashAt(t, c, b.srv.URL, hdr); !strings.Contains(f, "lease is live") {
		t.Errorf("release of a live lease without force: %q", f)
	}
	form.Set("force", "on")
	_, _, hdr = postForm(t, c, b.srv.URL+"/keys/release", form)
	if f := flashAt(t, c, b.srv.URL, hdr); !strings.HasPrefix(f, "ok: released the claim of fence") {
		t.Errorf("release: %q", f)
	}
	var actor string
	if err := b.db.Pool.QueryRow(ctx, `SELECT actor FROM idem_admin_audit WHERE action = 'keys.release'`).Scan(&actor); err != nil || !strings.HasPrefix(actor, "dave (console session ") {
		t.Errorf("audit actor %q, %v", actor, err)
	}
}

func fenceOf(t *testing.T, page string) string {
	t.Helper()
	i := strings.Index(page, `name="fence" value="`)
	if i < 0 {
		t.Fatalf("no fence field:\n%s", page)
	}
	rest := page[i+len(`name="fence" value="`):]
	return rest[:strings.IndexByte(rest, '"')]
}

func strconvI(n int64) string { return strconv.FormatInt(n, 10) }
