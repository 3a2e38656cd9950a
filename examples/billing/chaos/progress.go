package chaos

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress draws a live bar on a terminal, or writes plain lines.
type progress struct {
	w   io.Writer
	tty bool

	mu      sync.Mutex
	total   int64
	r       *run
	name    string
	pending int
	busy    string
	began   time.Time
	done    chan struct{}
	stopped chan struct{}
	drawn   bool
}

func newProgress(w io.Writer, tty bool) *progress {
	return &progress{w: w, tty: tty}
}

func (p *progress) logf(format string, a ...any) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	fmt.Fprintf(p.w, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

func (p *progress) clearLocked() {
	if p.tty && p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// start begins drawing the load phase.
func (p *progress) start(total int64, r *run) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	p.total, p.r, p.name, p.began = total, r, "load", time.Now()
	p.done, p.stopped = make(chan struct{}), make(chan struct{})
	p.mu.Unlock()
	every := 2 * time.Second
	if p.tty {
		every = 200 * time.Millisecond
	}
	go func() {
		defer close(p.stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
}

func (p *progress) phase(name string) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	p.name, p.pending = name, -1
	p.mu.Unlock()
	p.logf("load done; waiting for every order and payment to be final")
}

func (p *progress) setPending(n int) {
	p.mu.Lock()
	p.pending = n
	p.mu.Unlock()
}

// setBusy says what quiescence waits for once every status is final.
func (p *progress) setBusy(why string, err error) {
	if err != nil {
		why = "checking: " + err.Error()
	}
	p.mu.Lock()
	p.busy = why
	p.mu.Unlock()
}

func (p *progress) stop() {
	if p.w == nil || p.done == nil {
		return
	}
	close(p.done)
	<-p.stopped
	p.mu.Lock()
	p.clearLocked()
	p.done = nil
	p.mu.Unlock()
}

func (p *progress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.r.drv
	ops := d.ops.Load()
	stats := fmt.Sprintf("%d/%d POSTs  retries %d  replays %d  kills %d terms %d broker %d",
		ops, p.total, d.retries.Load(), d.replays.Load(), p.r.kills.Load(), p.r.terms.Load(), p.r.brokerRestarts.Load())
	if p.name == "quiescence" {
		stats = fmt.Sprintf("waiting for %d orders/payments to be final", max(p.pending, 0))
		if p.pending == 0 {
			stats = "all final; " + p.busy
		}
	}
	el := time.Since(p.began).Truncate(100 * time.Millisecond)
	if !p.tty {
		fmt.Fprintf(p.w, "%s %s %s (%v)\n", time.Now().Format("15:04:05.000"), p.name, stats, el)
		return
	}
	const width = 30
	fill := 0
	if p.total > 0 {
		fill = int(min(ops, p.total) * width / p.total)
	}
	if p.name == "quiescence" {
		fill = width
	}
	bar := strings.Repeat("█", fill) + strings.Repeat("░", width-fill)
	fmt.Fprintf(p.w, "\r\033[K%s %s %s", bar, stats, el)
	p.drawn = true
}
