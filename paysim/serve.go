package paysim

import (
	"context"
	"net"

	"github.com/idemkit/idem/internal/httpserver"
)

// Serve accepts connections on ln and serves the simulator on them with
// the Config's bounds: ReadHeaderTimeout, ReadTimeout, WriteTimeout (plus
// Latency), IdleTimeout, MaxHeaderBytes, and at most MaxConns connections
// at once on ln; one more is answered 503 TOO_MANY_CONNECTIONS and closed.
// Like http.Server.Serve it returns http.ErrServerClosed after Shutdown,
// and it closes ln.
func (s *Server) Serve(ln net.Listener) error {
	l := httpserver.LimitListener(ln, s.maxConns)
	s.lnsMu.Lock()
	s.lns = append(s.lns, l)
	s.lnsMu.Unlock()
	return s.http.Serve(l)
}

// Shutdown stops Serve gracefully, as http.Server.Shutdown does: no new
// connections, in-flight requests finish (each charge is either charged
// and answered or not charged), idle connections close, and the refusals
// of connections over the limit end. ctx bounds the wait; when it ends
// first Shutdown returns its error and leaves the rest running.
func (s *Server) Shutdown(ctx context.Context) error { return s.http.Shutdown(ctx) }

// connections sums count over the listeners Serve has wrapped.
func (s *Server) connections(count func(*httpserver.Listener) int64) int64 {
	s.lnsMu.Lock()
	defer s.lnsMu.Unlock()
	var n int64
	for _, l := range s.lns {
		n += count(l)
	}
	return n
}
