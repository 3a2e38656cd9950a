package main

import (
	"fmt"
	"io"

	"github.com/idemkit/idem/kafka"
)

// printTruncated says, for dlq show, that r is a reference copy and where
// its value came from.
func printTruncated(w io.Writer, r *kafka.DeadLetterRecord) {
	switch {
	case r.FromSource:
		fmt.Fprintf(w, "truncated\tyes: a reference copy of a %d-byte record; key, value and headers below are the original's, read from its source %s\n", r.Size, r.Source)
		for _, h := range r.SourceHeaders {
			fmt.Fprintf(w, "source header\t%s: %s\n", termSafe(h.Key, false), oneLineText(string(h.Value), 200))
		}
	case r.SourceGone:
		fmt.Fprintf(w, "truncated\tyes: a reference copy of a %d-byte record whose source %s is gone (retention): the value is lost, it cannot be redriven\n", r.Size, r.Source)
	}
}

// printRefused lists the records a redrive refused.
func printRefused(refused []kafka.RedriveRefusal) {
	for _, m := range refused {
		fmt.Printf("refused %s: %s (source %s)\n", termSafe(m.ID, false), oneLineText(m.Reason, 1000), termSafe(m.Source, false))
	}
}
