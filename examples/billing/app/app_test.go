package app_test

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/billing/app"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseRoles(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		in   string
		want app.Roles
		ok   bool
	}{
		{app.AllRoles, app.Roles{HTTP: true, Relay: true, Consumer: true, Charger: true}, true},
		{"http", app.Roles{HTTP: true}, true},
		{" relay , charger", app.Roles{Relay: true, Charger: true}, true},
		{"", app.Roles{}, false},
		{"http,,relay", app.Roles{}, false},
		{"web", app.Roles{}, false},
	}
	for _, tt := range testCases {
		got, err := app.ParseRoles(tt.in)
		if tt.ok != (err == nil) || (tt.ok && got != tt.want) {
			t.Errorf("%q: %+v %v", tt.in, got, err)
		}
		if tt.ok {
			if back, _ := app.ParseRoles(got.String()); back != got {
				t.Errorf("%q: String %q does not parse back", tt.in, got.String())
			}
		}
		if err != nil && !errors.Is(err, app.ErrBadRoles) {
			t.Errorf("%q: %v is not ErrBadRoles", tt.in, err)
		}
	}
}

func TestRunRejectsIncompleteConfig(t *testing.T) {
	t.Parallel()
	if err := app.Run(context.Background(), app.Config{}); err == nil {
		t.Fatal("Run without a pool succeeded")
	}
}
