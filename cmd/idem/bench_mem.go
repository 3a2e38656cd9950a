package main

import (
	"bufio"
	"bytes"
	"os"
	"runtime/metrics"
	"strconv"
)

// benchMemory is what a bench cost the process it ran in, which holds the
// subject (the middleware and its server, the relay, the consumer) and
// its load generator alike: the peak resident set and the heap
// allocations per operation of the run (runtime/metrics).
type benchMemory struct {
	// PeakRSSBytes is the process's peak resident set during the run
	// (Linux VmHWM, reset at the start when the kernel allows it; 0 where
	// /proc is not there).
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// AllocsPerOp and AllocBytesPerOp are heap allocations (objects and
	// bytes) during the run over the operations of all its results.
	AllocsPerOp     float64 `json:"allocs_per_op"`
	AllocBytesPerOp float64 `json:"alloc_bytes_per_op"`
}

var benchAllocSamples = []metrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}

// benchMemStart resets the peak RSS and returns the allocation counters.
func benchMemStart() (objects, bytes uint64) {
	// "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0).
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	metrics.Read(benchAllocSamples)
	return benchAllocSamples[0].Value.Uint64(), benchAllocSamples[1].Value.Uint64()
}

// benchMemEnd is the run's benchMemory since benchMemStart returned
// objects and bytes, over ops operations.
func benchMemEnd(objects, bytes uint64, ops int) benchMemory {
	metrics.Read(benchAllocSamples)
	m := benchMemory{PeakRSSBytes: peakRSS()}
	if ops > 0 {
		m.AllocsPerOp = float64(benchAllocSamples[0].Value.Uint64()-objects) / float64(ops)
		m.AllocBytesPerOp = float64(benchAllocSamples[1].Value.Uint64()-bytes) / float64(ops)
	}
	return m
}

// peakRSS reads VmHWM from /proc/self/status, in bytes.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmHWM:")); ok {
			f := bytes.Fields(v) // "1234", "kB"
			if len(f) >= 1 {
				n, _ := strconv.ParseInt(string(f[0]), 10, 64)
				return n << 10
			}
		}
	}
	return 0
}
