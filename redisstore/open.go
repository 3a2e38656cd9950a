package redisstore

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrInvalidURL is wrapped by every error of Open about its URL: a scheme
// other than redis, rediss or unix, a malformed host, database number or
// option. The message never quotes the URL's password.
var ErrInvalidURL = errors.New("redisstore: invalid Redis URL")

// Open connects a Store of its own to the server at rawURL and returns it;
// Close closes that client. The URL is go-redis's (redis.ParseURL):
//
//	redis://[user:password@]host[:port][/db][?option=value...]
//	rediss://... (TLS)   unix:///path/to/socket[?db=N]
//
// with one option of the store's own, prefix=P, which sets Config.Prefix
// (taken off the URL before go-redis reads it): the URL's prefix wins over
// cfg.Prefix, which is then a program's default.
// A URL that does not parse is an error wrapping ErrInvalidURL; a bad cfg,
// one wrapping ErrInvalidConfig. Open does no I/O: call CheckServer at
// start, which also tells whether the server can be reached.
func Open(rawURL string, cfg *Config) (*Store, error) {
	opts, prefix, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	var cc Config
	if cfg != nil {
		cc = *cfg
	}
	if prefix != "" {
		cc.Prefix = prefix
	}
	c := redis.NewClient(opts)
	s, err := New(c, &cc)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	s.closer = c
	return s, nil
}

// IsURL reports whether s names a Redis server as Open takes it: its
// scheme is redis, rediss or unix. It says nothing of the rest of the URL.
func IsURL(s string) bool {
	scheme, _, ok := strings.Cut(s, "://")
	if !ok {
		return false
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
		return true
	}
	return false
}

func parseURL(rawURL string) (*redis.Options, string, error) {
	if rawURL == "" {
		return nil, "", fmt.Errorf("%w: empty", ErrInvalidURL)
	}
	if !IsURL(rawURL) {
		return nil, "", fmt.Errorf("%w: want redis://, rediss:// or unix://", ErrInvalidURL)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		return nil, "", fmt.Errorf("%w: malformed", ErrInvalidURL)
	}
	q := u.Query()
	prefix := q.Get("prefix")
	if q.Has("prefix") && prefix == "" {
		return nil, "", fmt.Errorf("%w: option prefix is empty", ErrInvalidURL)
	}
	q.Del("prefix")
	u.RawQuery = q.Encode()
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "redis: ")
		if u.User != nil {
			if p, ok := u.User.Password(); ok && p != "" {
				msg = strings.ReplaceAll(msg, p, "***")
			}
		}
		return nil, "", fmt.Errorf("%w: %s", ErrInvalidURL, msg)
	}
	return opts, prefix, nil
}

// Close closes the client that Open made. For a Store of New, whose
// client belongs to the caller, it does nothing. Safe to call twice.
func (s *Store) Close() error {
	if s.closer == nil {
		return nil
	}
	err := s.closer.Close()
	if errors.Is(err, redis.ErrClosed) {
		return nil
	}
	return err
}
