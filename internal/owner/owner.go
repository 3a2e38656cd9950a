// Package owner names a process for the rows and slots it holds: the
// outbox relays' default Owner.
package owner

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// Default is "host-pid-random", its last maxLen bytes when longer: unique
// per process start (the random part tells a restarted process with a
// reused pid from its predecessor), readable in pg_stat_activity and in a
// lease column.
func Default(maxLen int) string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = crand.Read(b[:])
	s := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if len(s) > maxLen {
		s = s[len(s)-maxLen:]
	}
	return s
}
