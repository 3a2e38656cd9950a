package console

import (
	"bytes"
	"context"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/console/internal/dbsqlc"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/problem"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

//go:embed templates/*.html
var templateFS embed.FS

var funcs = template.FuncMap{
	"ts": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			if v.IsZero() {
				return "-"
			}
			return v.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if v == nil {
				return "-"
			}
			return v.UTC().Format("2006-01-02 15:04:05Z")
		}
		return fmt.Sprint(t)
	},
	"dur":   func(d time.Duration) string { return d.Round(time.Second).String() },
	"lower": strings.ToLower,
}

var pages = template.Must(template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html"))

func (c *Console) routes() {
	c.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, prefixOf(r)+"/outbox", http.StatusSeeOther)
	})
	c.mux.HandleFunc("GET /login", c.loginPage)
	c.mux.HandleFunc("POST /login", c.login)
	c.mux.HandleFunc("POST /logout", c.logout)
	c.mux.HandleFunc("GET /outbox", c.outboxPage)
	c.mux.HandleFunc("GET /outbox/event", c.eventPage)
	c.mux.HandleFunc("POST /outbox/requeue", c.post(c.requeue))
	c.mux.HandleFunc("POST /outbox/discard", c.post(c.discard))
	c.mux.HandleFunc("GET /keys", c.keysPage)
	c.mux.HandleFunc("POST /keys/release", c.post(c.releaseKey))
	c.mux.HandleFunc("POST /keys/forget", c.post(c.forgetKey))
	c.mux.HandleFunc("GET /inbox", c.inboxPage)
	c.mux.HandleFunc("GET /dlq", c.dlqPage)
	c.mux.HandleFunc("POST /dlq/redrive", c.post(c.redrive))
}

// page is what every template gets.
type page struct {
	Title  string
	Prefix string
	CSRF   string
	Msg    string
	Err    string
	Nav    string
	HasDLQ bool
	// SignedIn is the session's name when a token console has one: the
	// header then offers Sign out.
	SignedIn string
	Data     any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	msg, errText := c.takeFlash(w, r)
	p := page{Title: title, Prefix: prefixOf(r), CSRF: c.csrfToken(w, r), Msg: msg,
		Err: errText, Nav: name, HasDLQ: c.cfg.DLQ != nil, Data: data}
	if s := c.sessionOf(r); s != nil && c.cfg.Token != "" {
		p.SignedIn = s.name
	}
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, name+".html", p); err != nil {
		c.log.ErrorContext(r.Context(), "console: render", "page", name, "err", err)
		http.Error(w, "render failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b.Bytes())
}

// fail answers a failed read with the page's error banner.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	c.log.ErrorContext(r.Context(), "console: page failed", "path", problem.Clip(r.URL.Path, 100), "err", err)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintln(w, "the database could not be read; see the console's log")
}

// post wraps a state-changing handler: CSRF check, then the action, then
// a redirect back (POST/redirect/GET) with its outcome in a signed flash
// cookie.
func (c *Console) post(fn func(r *http.Request) (back, msg string, err error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			c.refuse(w, r, http.StatusBadRequest, "malformed form")
			return
		}
		if !c.csrfOK(r) {
			c.refuse(w, r, http.StatusForbidden, "missing or invalid CSRF field: reload the page and try again")
			return
		}
		back, msg, err := fn(r)
		if err != nil {
			c.setFlash(w, r, false, err.Error())
		} else {
			c.setFlash(w, r, true, msg)
		}
		http.Redirect(w, r, prefixOf(r)+back, http.StatusSeeOther)
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	// The link `idem console` prints carries the token: the form comes
	// filled in, and signing in is still a POST with its CSRF field.
	c.render(w, r, "login", "Sign in", map[string]string{"Token": r.URL.Query().Get("token")})
}

// maxNameLen bounds the name typed at sign-in (it goes to the audit trail).
const maxNameLen = 64

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil || !c.csrfOK(r) {
		c.refuse(w, r, http.StatusForbidden, "missing or invalid CSRF field: reload the page and try again")
		return
	}
	if c.cfg.Token == "" {
		http.Redirect(w, r, prefixOf(r)+"/outbox", http.StatusSeeOther)
		return
	}
	if !c.tokenOK(r.PostFormValue("token")) {
		c.refuse(w, r, http.StatusUnauthorized, "wrong token")
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	if name == "" || len(name) > maxNameLen || strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }) || !utf8.ValidString(name) {
		c.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("your name (1 to %d printable characters) is required: it is recorded with every action", maxNameLen))
		return
	}
	id, tag := c.newSession(name)
	c.setCookie(w, r, sessionCookie, id, c.cfg.SessionTTL)
	c.log.InfoContext(r.Context(), "console: signed in", "actor", name+" (console session "+tag+")", "remote", r.RemoteAddr)
	http.Redirect(w, r, prefixOf(r)+"/outbox", http.StatusSeeOther)
}

// logout ends the browser's session (the sign-out button).
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil || !c.csrfOK(r) {
		c.refuse(w, r, http.StatusForbidden, "missing or invalid CSRF field: reload the page and try again")
		return
	}
	who := c.actor(r)
	c.endSession(r)
	c.setCookie(w, r, sessionCookie, "", -1)
	c.log.InfoContext(r.Context(), "console: signed out", "actor", who)
	http.Redirect(w, r, prefixOf(r)+"/login", http.StatusSeeOther)
}

// chart is the backlog chart: an SVG polyline over the samples.
type chart struct {
	Points    string
	DeadPts   string
	Max       int64
	Samples   int
	Window    time.Duration
	FirstAt   time.Time
	LastAt    time.Time
	LastValue int64
}

const chartW, chartH = 600.0, 120.0

func (c *Console) chart() chart {
	c.mu.Lock()
	s := append([]sample(nil), c.samples...)
	c.mu.Unlock()
	ch := chart{Samples: len(s), Window: c.cfg.SampleWindow}
	if len(s) == 0 {
		return ch
	}
	ch.FirstAt, ch.LastAt, ch.LastValue = s[0].At, s[len(s)-1].At, s[len(s)-1].Pending
	for _, x := range s {
		ch.Max = max(ch.Max, x.Pending, x.Dead)
	}
	top := float64(max(ch.Max, 1))
	// The x axis spans the samples kept (at most SampleWindow), so a young
	// console's few samples fill the chart instead of a sliver of it.
	end := s[len(s)-1].At
	span := max(end.Sub(s[0].At), time.Millisecond)
	var pts, dead strings.Builder
	for _, x := range s {
		px := chartW - float64(end.Sub(x.At))/float64(span)*chartW
		fmt.Fprintf(&pts, "%.1f,%.1f ", px, chartH-float64(x.Pending)/top*chartH)
		fmt.Fprintf(&dead, "%.1f,%.1f ", px, chartH-float64(x.Dead)/top*chartH)
	}
	ch.Points, ch.DeadPts = pts.String(), dead.String()
	return ch
}

type deadRow struct {
	outbox.EventRecord
	PayloadText string
}

func payloadText(e *outbox.EventRecord) string {
	if e.PayloadIsJSON() {
		var b bytes.Buffer
		if json.Indent(&b, e.Payload, "", "  ") == nil {
			return b.String()
		}
	}
	return strconv.Quote(string(e.Payload))
}

func (c *Console) outboxPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	st, err := outbox.GetStatus(ctx, c.db, c.cfg.LeaseTTL, 0)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	dead, err := c.admin.List(ctx, outbox.ListFilter{Status: outbox.StatusDead, Limit: 200})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	rows := make([]deadRow, len(dead))
	for i := range dead {
		rows[i] = deadRow{EventRecord: dead[i], PayloadText: payloadText(&dead[i])}
	}
	recent, err := c.admin.List(ctx, outbox.ListFilter{Status: r.URL.Query().Get("status"), Limit: 50})
	if err != nil && !errors.Is(err, outbox.ErrInvalidFilter) {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "outbox", "Outbox", map[string]any{
		"Status": st, "Dead": rows, "Chart": c.chart(), "Recent": recent, "Filter": r.URL.Query().Get("status"),
	})
}

func (c *Console) eventPage(w http.ResponseWriter, r *http.Request) {
	e, err := c.admin.Show(r.Context(), r.URL.Query().Get("id"))
	if errors.Is(err, outbox.ErrEventNotFound) {
		w.WriteHeader(http.StatusNotFound)
		c.render(w, r, "event", "Event not found", nil)
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "event", "Event "+e.EventID, deadRow{EventRecord: *e, PayloadText: payloadText(e)})
}

func backTo(r *http.Request, def string) string {
	if b := r.PostFormValue("back"); strings.HasPrefix(b, "/") && !strings.HasPrefix(b, "//") {
		return b
	}
	return def
}

func (c *Console) requeue(r *http.Request) (string, string, error) {
	id, reason := r.PostFormValue("id"), r.PostFormValue("reason")
	who := c.actor(r)
	err := c.admin.Requeue(r.Context(), id, outbox.Action{Actor: who, Reason: reason})
	c.logAction(r.Context(), "requeue", who, id, reason, err)
	if err != nil {
		return backTo(r, "/outbox"), "", err
	}
	return backTo(r, "/outbox"), "requeued " + id + ": it is PENDING and the relay will publish it", nil
}

func (c *Console) discard(r *http.Request) (string, string, error) {
	id, reason := r.PostFormValue("id"), r.PostFormValue("reason")
	who := c.actor(r)
	err := c.admin.Discard(r.Context(), id, outbox.Action{Actor: who, Reason: reason})
	c.logAction(r.Context(), "discard", who, id, reason, err)
	if err != nil {
		return backTo(r, "/outbox"), "", err
	}
	return backTo(r, "/outbox"), "discarded " + id + ": the later events of its aggregate flow again", nil
}

func (c *Console) logAction(ctx context.Context, action, who, subject, reason string, err error) {
	if err != nil {
		c.log.WarnContext(ctx, "console: action refused", "action", action, "actor", who, "subject", subject, "reason", reason, "err", err)
		return
	}
	c.log.InfoContext(ctx, "console: action", "action", action, "actor", who, "subject", subject, "reason", reason)
}

// recentKeyEvents keeps the last conflicts and mismatches IdempotencyHook saw.
type keyEvent struct {
	At     time.Time
	Kind   string
	Method string
	Route  string
}

const keyEventsMax = 50

// IdempotencyHook returns a hook for idempotency.Config.Hook that keeps
// the last conflicts (409 in progress) and mismatches (a key reused with
// another request) for the keys page. It carries no key and no principal.
func (c *Console) IdempotencyHook() func(ctx context.Context, e idempotency.Event) context.Context {
	return func(ctx context.Context, e idempotency.Event) context.Context {
		if e.Kind != idempotency.EventConflict && e.Kind != idempotency.EventMismatch {
			return ctx
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.keyEvents = append(c.keyEvents, keyEvent{At: time.Now(), Kind: string(e.Kind), Method: e.Method, Route: e.Route})
		if len(c.keyEvents) > keyEventsMax {
			c.keyEvents = append([]keyEvent(nil), c.keyEvents[len(c.keyEvents)-keyEventsMax:]...)
		}
		return ctx
	}
}

type keyLookup struct {
	Principal, Method, Route, Key string
	Asked                         bool
	Record                        *idempotency.KeyRecord
	NotFound                      bool
}

type keyRow struct {
	Hash        string
	LockedUntil time.Time
	CreatedAt   time.Time
	ExpiresAt   time.Time
	LeaseLive   bool
}

func (c *Console) keysPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := dbsqlc.New(c.db)
	counts, err := q.KeyCounts(ctx)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	inProg, err := q.KeysInProgress(ctx, 50)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	rows := make([]keyRow, len(inProg))
	for i, k := range inProg {
		rows[i] = keyRow{Hash: hex.EncodeToString(k.KeyHash)[:16], LockedUntil: k.LockedUntil.Time, CreatedAt: k.CreatedAt.Time,
			ExpiresAt: k.ExpiresAt.Time, LeaseLive: k.LeaseLive}
	}
	lk := keyLookup{Principal: r.URL.Query().Get("principal"), Method: r.URL.Query().Get("method"),
		Route: r.URL.Query().Get("route"), Key: r.URL.Query().Get("key")}
	if lk.Method == "" {
		lk.Method = http.MethodPost
	}
	if lk.Principal != "" && lk.Route != "" && lk.Key != "" {
		lk.Asked = true
		rec, err := c.keys.Inspect(ctx, idempotency.HashKey(lk.Principal, strings.ToUpper(lk.Method), lk.Route, lk.Key))
		switch {
		case errors.Is(err, idempotency.ErrKeyNotFound):
			lk.NotFound = true
		case err != nil:
			c.fail(w, r, err)
			return
		default:
			lk.Record = rec
		}
	}
	c.mu.Lock()
	events := make([]keyEvent, len(c.keyEvents))
	for i := range c.keyEvents { // newest first
		events[i] = c.keyEvents[len(c.keyEvents)-1-i]
	}
	c.mu.Unlock()
	c.render(w, r, "keys", "Idempotency keys", map[string]any{
		"Counts": counts, "InProgress": rows, "Lookup": lk, "Events": events,
	})
}

func (c *Console) releaseKey(r *http.Request) (string, string, error) {
	return c.keyAction(r, false)
}

func (c *Console) forgetKey(r *http.Request) (string, string, error) {
	return c.keyAction(r, true)
}

// keyAction releases (or forgets) the claim the page showed: its fence is
// the form's hidden field, so a retry that took the key over since is left
// alone; a live lease needs the force box.
func (c *Console) keyAction(r *http.Request, forget bool) (string, string, error) {
	p, m, route, key := r.PostFormValue("principal"), strings.ToUpper(r.PostFormValue("method")), r.PostFormValue("route"), r.PostFormValue("key")
	back := "/keys?" + url.Values{"principal": {p}, "method": {m}, "route": {route}, "key": {key}}.Encode()
	fence, err := strconv.ParseInt(r.PostFormValue("fence"), 10, 64)
	if err != nil || fence <= 0 {
		return back, "", errors.New("the form carries no fence: look the key up again")
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		return back, "", errors.New("a reason is required: it is recorded with the action")
	}
	who := c.actor(r)
	hash := idempotency.HashKey(p, m, route, key)
	op := idempotency.AdminAction{Fence: fence, Force: r.PostFormValue("force") == "on", Actor: who, Reason: reason}
	action, done := "release-key", fmt.Sprintf("released the claim of fence %d: the next request with the same body runs the handler again", fence)
	if forget {
		action, done = "forget-key", fmt.Sprintf("forgot the record of fence %d: the next request with the key runs the handler again", fence)
		err = c.keys.Forget(r.Context(), hash, op)
	} else {
		err = c.keys.ForceRelease(r.Context(), hash, op)
	}
	c.logAction(r.Context(), action, who, idempotency.KeyHashHex(hash)[:16], reason, err)
	if errors.Is(err, idempotency.ErrLeaseLive) {
		return back, "", fmt.Errorf("%w: its handler may still run; nothing changed (tick force to act anyway)", err)
	}
	if err != nil {
		return back, "", fmt.Errorf("%w; nothing changed", err)
	}
	return back, done, nil
}

func (c *Console) inboxPage(w http.ResponseWriter, r *http.Request) {
	rows, err := dbsqlc.New(c.db).InboxByConsumer(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "inbox", "Inbox", rows)
}

type dlqTopic struct {
	Topic   string
	Records []kafka.DeadLetterRecord
	Err     string
}

func (c *Console) dlqPage(w http.ResponseWriter, r *http.Request) {
	var topics []dlqTopic
	if c.cfg.DLQ != nil {
		for _, t := range c.cfg.DeadLetterTopics {
			ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
			recs, err := c.cfg.DLQ.List(ctx, t, 200)
			cancel()
			dt := dlqTopic{Topic: t, Records: recs}
			if err != nil {
				dt.Err = err.Error()
			}
			topics = append(topics, dt)
		}
	}
	c.render(w, r, "dlq", "Dead-letter topics", topics)
}

func (c *Console) redrive(r *http.Request) (string, string, error) {
	if c.cfg.DLQ == nil {
		return "/dlq", "", errors.New("no Kafka configured")
	}
	from, filter := r.PostFormValue("from"), r.PostFormValue("filter_error")
	known := false
	for _, t := range c.cfg.DeadLetterTopics {
		known = known || t == from
	}
	if !known {
		return "/dlq", "", fmt.Errorf("%q is not one of the console's dead-letter topics", from)
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		return "/dlq", "", errors.New("a reason is required: it is recorded with the redrive")
	}
	force := r.PostFormValue("force") == "on"
	who := c.actor(r)
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
	defer cancel()
	// The ledger (c.db) serializes this redrive with any other of the
	// topic (the CLI's, another console's) and records it in
	// idem_admin_audit under the signed-in session's name.
	rep, err := c.cfg.DLQ.Redrive(ctx, kafka.RedriveOptions{From: from, FilterError: filter, DB: c.db, Actor: who, Reason: reason, Force: force})
	subject := from
	if rep != nil {
		subject = fmt.Sprintf("%s (moved %d, audit row %d)", from, len(rep.Moved), rep.AuditID)
	}
	c.logAction(r.Context(), "redrive", who, subject, reason, err)
	if err != nil {
		return "/dlq", "", err
	}
	return "/dlq", fmt.Sprintf("redrove %d records from %s (%d already redriven, %d filtered out; audit row %d)", len(rep.Moved), from, len(rep.AlreadyRedriven), rep.Filtered, rep.AuditID), nil
}
