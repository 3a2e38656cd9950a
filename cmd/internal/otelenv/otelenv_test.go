package otelenv_test

import (
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/cmd/internal/otelenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFromEnv(t *testing.T) {
	for _, tt := range []struct {
		traces, metrics   string
		wantTraces, wantM bool
		bad               bool
	}{
		{"", "", false, false, false},
		{"none", "none", false, false, false},
		{"console", "", true, false, false},
		{"", "console", false, true, false},
		{"console", "console", true, true, false},
		{"zipkin", "", false, false, true},
		{"", "statsd", false, false, true},
	} {
		t.Run(tt.traces+"/"+tt.metrics, func(t *testing.T) {
			t.Setenv(otelenv.EnvTraces, tt.traces)
			t.Setenv(otelenv.EnvMetrics, tt.metrics)
			s, err := otelenv.FromEnv(t.Context(), "test")
			if tt.bad {
				if !errors.Is(err, otelenv.ErrBadEnv) {
					t.Fatalf("FromEnv: %v, want ErrBadEnv", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := s.Shutdown(t.Context()); err != nil {
					t.Error(err)
				}
			}()
			if s.Traces != tt.wantTraces || s.Metrics != tt.wantM || (s.Tel != nil) != (tt.wantTraces || tt.wantM) {
				t.Fatalf("traces %v metrics %v tel %v; want traces %v metrics %v", s.Traces, s.Metrics, s.Tel != nil, tt.wantTraces, tt.wantM)
			}
		})
	}
}
