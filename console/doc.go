// Package console is idem's admin web console: an http.Handler to mount on
// a service's admin port, and what `idem console` serves.
//
// Usage:
//
//	c, err := console.New(pool, &console.Config{Token: os.Getenv("IDEM_CONSOLE_TOKEN")})
//	_ = c.Start(ctx) // the backlog sampler
//	adminMux.Handle("/", c)
//
// # What it shows
//
// Pages: the outbox (counts by status, the oldest pending age, a chart of
// the backlog over the last SampleWindow from the sampler's periodic
// samples, dead events with payload and error and requeue and discard
// buttons, each event's audit trail), idempotency keys (counts by state,
// claimed keys, a lookup by principal, method, route and key that hashes
// the parts like the middleware, a release button, and the recent
// conflicts and mismatches seen by IdempotencyHook), the inbox (processed
// events per consumer), and dead-letter topics (records and a redrive
// button) when a kafka.DLQ is configured.
//
// Pages are server-rendered html/template with no JavaScript and no
// external resource: the console works without network access.
//
// It is an admin surface, so:
//   - without Config.Token it answers only requests whose Host is a
//     loopback name (127.0.0.1, ::1, localhost), which keeps a web page
//     from reaching it through DNS rebinding; `idem console` listens on
//     127.0.0.1 by default and refuses any other address without
//     IDEM_CONSOLE_TOKEN;
//   - with a token, every request needs it (a bearer header or the login
//     form's cookie), compared in constant time;
//   - every state change is a POST carrying a CSRF field: an HMAC, under
//     a per-process secret, of a random per-browser cookie that is
//     HttpOnly and SameSite=Strict;
//   - every action goes through outbox.Admin or idempotency.PostgresStore
//     (so the outbox row's audit trail records it, actor
//     "console@<remote address>") and is logged.
//
// What it does not do: it has no users or roles (the token is one shared
// secret), and it does not terminate TLS; put it behind a proxy that does
// when it leaves the host.
package console
