// Package pgwire counts what a PostgreSQL client puts on the wire: the
// frontend messages of every connection dialled through a Counter, and
// the round trips they cost. Tests use it to pin how many round trips a
// request takes, so that a change that adds one fails; the bench reports
// the same figure.
//
//	c := pgwire.NewCounter()
//	cfg.ConnConfig.DialFunc = c.DialFunc(nil)
//	... // run the requests
//	n := c.Counts().RoundTrips
//
// A round trip is counted when the client sends a message that makes the
// server answer and end with ReadyForQuery (Sync, of the extended
// protocol, or a simple Query) while no such message is already waiting
// for its answer; it ends when the client next reads. So a pipeline of
// several Syncs sent before any read is one round trip, as it is on the
// wire, and a prepare followed, after its answer, by the execute is two.
// The startup and authentication exchange is not counted.
//
// What it does not do: it does not parse the server's side, and a client
// that reads in the background while it writes (pgx does, for writes that
// block for long) may split what is one round trip into two. TLS
// connections cannot be parsed: dial with sslmode=disable.
package pgwire

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
)

// Counts is what a Counter saw since it was made or last Reset.
type Counts struct {
	// RoundTrips is the number of round trips (see the package doc).
	RoundTrips int
	// Syncs and Queries are the Sync and simple Query messages sent.
	Syncs, Queries int
	// Messages counts every frontend message by its type byte
	// ('P' Parse, 'B' Bind, 'E' Execute, 'D' Describe, 'S' Sync, 'Q' Query, ...).
	Messages map[byte]int
}

// Counter counts the frontend messages of the connections it dials. It is
// safe for concurrent use; its counts cover all its connections.
type Counter struct {
	mu sync.Mutex
	c  Counts
}

// NewCounter returns a Counter with zero counts.
func NewCounter() *Counter { return &Counter{c: Counts{Messages: map[byte]int{}}} }

// Counts returns a copy of the counts.
func (c *Counter) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.c
	out.Messages = make(map[byte]int, len(c.c.Messages))
	for k, v := range c.c.Messages {
		out.Messages[k] = v
	}
	return out
}

// Reset sets every count to zero.
func (c *Counter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c = Counts{Messages: map[byte]int{}}
}

// DialFunc returns a dial function (pgconn.Config.DialFunc's shape) that
// dials with dial, or a net.Dialer when dial is nil, and counts what is
// written on the connection.
func (c *Counter) DialFunc(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &conn{Conn: nc, c: c, startup: true}, nil
	}
}

// conn parses the frontend stream of one connection as it is written.
type conn struct {
	net.Conn
	c *Counter

	mu       sync.Mutex
	startup  bool   // before the startup message: messages have no type byte
	hdr      []byte // the header of the message being parsed (type and length, or length and code in startup)
	left     int    // bytes of the current message's body still to skip
	awaiting bool   // a Sync or Query was sent and nothing was read since
}

func (k *conn) Read(b []byte) (int, error) {
	n, err := k.Conn.Read(b)
	if n > 0 {
		k.mu.Lock()
		k.awaiting = false
		k.mu.Unlock()
	}
	return n, err
}

func (k *conn) Write(b []byte) (int, error) {
	k.mu.Lock()
	k.parse(b)
	k.mu.Unlock()
	return k.Conn.Write(b)
}

// parse feeds b through the message parser. Called with k.mu held.
func (k *conn) parse(b []byte) {
	for len(b) > 0 {
		if k.left > 0 {
			n := min(k.left, len(b))
			k.left -= n
			b = b[n:]
			continue
		}
		want := 5
		if k.startup {
			want = 8
		}
		n := min(want-len(k.hdr), len(b))
		k.hdr = append(k.hdr, b[:n]...)
		b = b[n:]
		if len(k.hdr) < want {
			return
		}
		if k.startup {
			// SSLRequest, GSSENCRequest, CancelRequest or the
			// StartupMessage: the length (including itself), then a
			// 4-byte code. Only the StartupMessage, whose code is the
			// protocol version 3.x (0x0003xxxx), ends the untyped phase.
			l := int(binary.BigEndian.Uint32(k.hdr))
			k.left = l - 8
			if binary.BigEndian.Uint32(k.hdr[4:])>>16 == 3 {
				k.startup = false
			}
			k.hdr = k.hdr[:0]
			continue
		}
		typ := k.hdr[0]
		l := int(binary.BigEndian.Uint32(k.hdr[1:]))
		k.left = l - 4
		k.hdr = k.hdr[:0]
		k.count(typ)
	}
}

func (k *conn) count(typ byte) {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	k.c.c.Messages[typ]++
	switch typ {
	case 'S':
		k.c.c.Syncs++
	case 'Q':
		k.c.c.Queries++
	default:
		return
	}
	if !k.awaiting {
		k.awaiting = true
		k.c.c.RoundTrips++
	}
}
