package kafka_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/kafka"
)

// The dlq-source header comes from whatever wrote the record: any value
// gives either no topic or the part before its last two slashes.
func FuzzSourceTopic(f *testing.F) {
	for _, s := range []string{"orders.events/0/12", "a/b/c/1/2", "x", "/0/1", "t//", "", "t/1", "é/\x00/\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		got := kafka.SourceTopicForTest(src)
		if got == "" {
			return
		}
		rest, ok := strings.CutPrefix(src, got+"/")
		if !ok || strings.Count(rest, "/") != 1 {
			t.Fatalf("sourceTopic(%q) = %q", src, got)
		}
	})
}
