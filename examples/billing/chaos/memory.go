package chaos

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Memory is the resident memory of the billing serve processes, as the
// harness read it from /proc/PID/status once a second (and just before
// each stop) for every running instance: the process's own figures, not
// the harness's, whose load generator runs in another process.
type Memory struct {
	// PeakRSSBytes is the highest peak resident set (VmHWM) of any
	// incarnation of any instance; 0 where /proc is not there.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// Instances are the instances in name order.
	Instances []InstanceMemory `json:"instances"`
}

// InstanceMemory is one billing instance over all its incarnations.
type InstanceMemory struct {
	Name string `json:"name"`
	// PeakRSSBytes is the highest VmHWM read from any of its incarnations.
	// VmHWM is the kernel's own high-water mark of the process, so a peak
	// between two samples counts too; a SIGKILLed incarnation keeps the
	// value of its last sample, taken just before the signal.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// LastRSSBytes is VmRSS at the last sample, of whichever incarnation
	// was running then.
	LastRSSBytes int64 `json:"last_rss_bytes"`
	// Samples is how many times /proc was read for it.
	Samples int `json:"samples"`
}

// memSampler keeps each instance's memory across its restarts.
type memSampler struct {
	mu   sync.Mutex
	byID map[string]*InstanceMemory
}

func newMemSampler() *memSampler { return &memSampler{byID: map[string]*InstanceMemory{}} }

// sample reads p's running incarnation, if any. A process that exits
// between pid and the read is skipped: its previous sample stands.
func (s *memSampler) sample(p *proc) {
	pid := p.pid()
	if pid == 0 {
		return
	}
	rss, hwm, ok := procMemory(pid)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.byID[p.name]
	if m == nil {
		m = &InstanceMemory{Name: p.name}
		s.byID[p.name] = m
	}
	m.Samples++
	m.LastRSSBytes = rss
	m.PeakRSSBytes = max(m.PeakRSSBytes, hwm, rss)
}

// report is the run's Memory; nil when no instance was ever sampled.
func (s *memSampler) report() *Memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byID) == 0 {
		return nil
	}
	out := &Memory{}
	for _, m := range s.byID {
		out.Instances = append(out.Instances, *m)
		out.PeakRSSBytes = max(out.PeakRSSBytes, m.PeakRSSBytes)
	}
	sort.Slice(out.Instances, func(i, j int) bool { return out.Instances[i].Name < out.Instances[j].Name })
	return out
}

// procMemory reads VmRSS and VmHWM of pid from /proc, in bytes.
func procMemory(pid int) (rss, hwm int64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, found := bytes.Cut(sc.Bytes(), []byte(":"))
		if !found {
			continue
		}
		var dst *int64
		switch string(k) {
		case "VmRSS":
			dst = &rss
		case "VmHWM":
			dst = &hwm
		default:
			continue
		}
		f := bytes.Fields(v) // "1234", "kB"
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			continue
		}
		*dst = n << 10
	}
	// A zombie (exited, not yet reaped) has no Vm lines.
	return rss, hwm, hwm > 0 || rss > 0
}

// mib formats bytes in MiB, one decimal.
func mib(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB" }

// describe is the report's line: the peak over all instances, then each
// instance's.
func (m *Memory) describe() string {
	var per []string
	for _, in := range m.Instances {
		per = append(per, fmt.Sprintf("%s %s", in.Name, mib(in.PeakRSSBytes)))
	}
	return fmt.Sprintf("billing serve peak RSS %s (%s; VmHWM of each process, read every second and before each stop)",
		mib(m.PeakRSSBytes), strings.Join(per, ", "))
}
