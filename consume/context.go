package consume

import (
	"context"
	"errors"
)

type eventIDKey struct{}

// EventIDFromContext returns the event id of the message a Handler or
// Prepare is processing ("" outside one). Build the idempotency keys of
// downstream effects from it.
func EventIDFromContext(ctx context.Context) string {
	s, _ := ctx.Value(eventIDKey{}).(string)
	return s
}

type preparedKey struct{}

// PreparedFromContext returns the result of Config.Prepare for the message
// a Handler is processing (nil without Prepare).
func PreparedFromContext(ctx context.Context) any {
	return ctx.Value(preparedKey{})
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks a handler (or Prepare) error as not worth retrying (a
// malformed payload): the message is dead-lettered at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked by Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
