package kafkago_test

import (
	"log/slog"
	"os"
)

func quiet() *slog.Logger {
	if os.Getenv("KAFKAGO_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
