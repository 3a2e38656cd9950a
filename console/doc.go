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
//   - without Config.Token it answers only requests whose peer address is
//     loopback and whose Host is a loopback name (127.0.0.1, ::1,
//     localhost), which keeps a web page from reaching it through DNS
//     rebinding; every local user can act through it then. `idem console`
//     always has a token: IDEM_CONSOLE_TOKEN, or one made at start and
//     printed once; it listens on 127.0.0.1 by default and refuses any
//     other address without IDEM_CONSOLE_TOKEN;
//   - with a token, every request needs it: a bearer header, or a session
//     started by the login form (a random server-side id in an HttpOnly,
//     SameSite=Strict cookie, expiring after Config.SessionTTL, ended by
//     sign-out or RevokeSessions; Secure and __Host- over TLS or behind
//     Config.TrustedProxies saying https). The token is compared in
//     constant time and never stored in the browser;
//   - every state change is a POST carrying a CSRF field: an HMAC, under
//     a per-process secret, of a random per-browser cookie that is
//     HttpOnly and SameSite=Strict;
//   - every action goes through outbox.Admin or idempotency.PostgresStore
//     (the outbox row's audit trail, or the idem_admin_audit table for
//     keys, records it with the signed-in session's name and tag) and is
//     logged; a key's release or forget carries the fence of the record
//     shown, so a claim taken over since is left alone; a redrive needs
//     a reason and goes through kafka.DLQ.Redrive with the console's
//     database as its ledger (one idem_admin_audit row under the
//     session's name, each record published once even against a
//     concurrent redrive);
//   - the outcome banner comes from a flash cookie signed by the process,
//     never from the link.
//
// What it does not do: it has no users or roles (the token is one shared
// secret; the name typed at sign-in is recorded, not verified), and it does not terminate TLS; put it behind a proxy that does
// when it leaves the host.
package console
