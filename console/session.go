package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// session is one signed-in browser: a random id known only to that
// browser's cookie and to this process, with an expiry. The token never
// leaves the login form.
type session struct {
	name    string // who signed in, as typed at the login form
	tag     string // a short, non-secret name of the session for the logs
	expires time.Time
}

// sessionsMax bounds the sessions kept; beyond it the one closest to its
// expiry is dropped.
const sessionsMax = 1024

// secure tells whether the browser reached the console over TLS: directly,
// or through a proxy of Config.TrustedProxies that says so with
// X-Forwarded-Proto: https. Only then are cookies Secure and __Host-.
func (c *Console) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if len(c.cfg.TrustedProxies) == 0 || r.Header.Get("X-Forwarded-Proto") != "https" {
		return false
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	for _, p := range c.cfg.TrustedProxies {
		if p.Contains(ap.Addr().Unmap()) {
			return true
		}
	}
	return false
}

// cookieName is name, prefixed __Host- over TLS: the browser then accepts
// it only Secure, for Path / and without a Domain, so that no other
// origin on the host can set or shadow it.
func (c *Console) cookieName(r *http.Request, name string) string {
	if c.secure(r) {
		return "__Host-" + name
	}
	return name
}

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge time.Duration) {
	ck := &http.Cookie{Name: c.cookieName(r, name), Value: value, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: c.secure(r)}
	switch {
	case maxAge < 0:
		ck.MaxAge = -1
	case maxAge > 0:
		ck.MaxAge = max(1, int(maxAge/time.Second))
		ck.Expires = time.Now().Add(maxAge)
	}
	http.SetCookie(w, ck)
}

func (c *Console) cookie(r *http.Request, name string) string {
	ck, err := r.Cookie(c.cookieName(r, name))
	if err != nil {
		return ""
	}
	return ck.Value
}

// newSession signs name in and returns the session's id (the cookie) and
// its tag.
func (c *Console) newSession(name string) (id, tag string) {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	id = hex.EncodeToString(b)
	sum := sha256.Sum256([]byte(id))
	tag = hex.EncodeToString(sum[:4])
	now := time.Now()
	c.smu.Lock()
	defer c.smu.Unlock()
	for k, s := range c.sessions {
		if !now.Before(s.expires) {
			delete(c.sessions, k)
		}
	}
	for len(c.sessions) >= sessionsMax {
		var oldest string
		for k, s := range c.sessions {
			if oldest == "" || s.expires.Before(c.sessions[oldest].expires) {
				oldest = k
			}
		}
		delete(c.sessions, oldest)
	}
	c.sessions[id] = &session{name: name, tag: tag, expires: now.Add(c.cfg.SessionTTL)}
	return id, tag
}

// sessionOf returns the live session of r's cookie, or nil.
func (c *Console) sessionOf(r *http.Request) *session {
	id := c.cookie(r, sessionCookie)
	if id == "" {
		return nil
	}
	c.smu.Lock()
	defer c.smu.Unlock()
	s := c.sessions[id]
	if s == nil {
		return nil
	}
	if !time.Now().Before(s.expires) {
		delete(c.sessions, id)
		return nil
	}
	return s
}

func (c *Console) endSession(r *http.Request) {
	id := c.cookie(r, sessionCookie)
	c.smu.Lock()
	delete(c.sessions, id)
	c.smu.Unlock()
}

// RevokeSessions signs every browser out: their next request goes to the
// login form. Bearer-token requests are not affected (change the token).
func (c *Console) RevokeSessions() {
	c.smu.Lock()
	clear(c.sessions)
	c.smu.Unlock()
}

// Sessions is the number of signed-in sessions that have not expired.
func (c *Console) Sessions() int {
	now := time.Now()
	c.smu.Lock()
	defer c.smu.Unlock()
	n := 0
	for _, s := range c.sessions {
		if now.Before(s.expires) {
			n++
		}
	}
	return n
}

// loopbackPeer tells whether r came from a loopback address.
func loopbackPeer(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// The flash is the outcome banner of a state change, carried across its
// redirect in a cookie signed under the process's secret: the page shows
// only what the console itself set, never text from a link.
const flashCookie = "idem_console_flash"

func (c *Console) flashMAC(v string) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("flash/v1/" + v))
	return hex.EncodeToString(m.Sum(nil))
}

func (c *Console) setFlash(w http.ResponseWriter, r *http.Request, ok bool, text string) {
	kind := "e"
	if ok {
		kind = "m"
	}
	if len(text) > 600 {
		text = strings.ToValidUTF8(text[:600], "") + "…"
	}
	v := base64.RawURLEncoding.EncodeToString([]byte(kind + text))
	c.setCookie(w, r, flashCookie, v+"."+c.flashMAC(v), 0)
}

// takeFlash returns the flash of r, if signed by this process, and clears it.
func (c *Console) takeFlash(w http.ResponseWriter, r *http.Request) (msg, errText string) {
	raw := c.cookie(r, flashCookie)
	if raw == "" {
		return "", ""
	}
	c.setCookie(w, r, flashCookie, "", -1)
	v, mac, ok := strings.Cut(raw, ".")
	if !ok || !hmac.Equal([]byte(mac), []byte(c.flashMAC(v))) {
		return "", ""
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(b) == 0 {
		return "", ""
	}
	if b[0] == 'm' {
		return string(b[1:]), ""
	}
	return "", string(b[1:])
}
