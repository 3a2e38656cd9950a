package idemprom

import "sync"

// maxLabelValues bounds the distinct values one metric attribute takes
// from something the instrumentation does not choose itself (routes,
// topics, consumer ids); later values are reported as otherLabel. A route
// is a pattern by default, but idempotency.Config.Route falls back to the
// raw path when a request has no pattern, and a raw path would make a
// series per id, kept for the life of the process.
const maxLabelValues = 100

const otherLabel = "other"

// labelSet admits the first maxLabelValues values it is asked about.
type labelSet struct {
	mu   sync.RWMutex
	seen map[string]struct{}
}

func (l *labelSet) value(v string) string {
	l.mu.RLock()
	_, ok := l.seen[v]
	n := len(l.seen)
	l.mu.RUnlock()
	if ok {
		return v
	}
	if n >= maxLabelValues {
		return otherLabel
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]struct{}{}
	}
	if _, ok := l.seen[v]; !ok && len(l.seen) >= maxLabelValues {
		return otherLabel
	}
	l.seen[v] = struct{}{}
	return v
}
