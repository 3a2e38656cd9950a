package idempotency

import (
	"container/list"
	"sync"
	"time"
)

// replayCache keeps recently replayed completed records in process memory,
// bounded by bytes, so that a retry storm on completed keys does not reach
// the store. A completed record changes before it expires only when an
// operator forgets it; an entry lives no longer than Config.ReplayCacheTTL
// (and the record's remaining retention as the store reported it), so a
// Forget reaches every instance within that TTL, after which the store's
// answer is authoritative.
type replayCache struct {
	mu    sync.Mutex
	max   int64
	size  int64
	ll    *list.List // front: most recent
	items map[KeyHash]*list.Element
}

type cacheEntry struct {
	key      KeyHash
	fp       Fingerprint
	resp     *Response
	deadline time.Time
	size     int64
}

func newReplayCache(maxBytes int64) *replayCache {
	if maxBytes <= 0 {
		return nil
	}
	return &replayCache{max: maxBytes, ll: list.New(), items: map[KeyHash]*list.Element{}}
}

// get returns the live entry of key, or nil.
func (c *replayCache) get(key KeyHash, now time.Time) *cacheEntry {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el := c.items[key]
	if el == nil {
		return nil
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.deadline) {
		c.remove(el)
		return nil
	}
	c.ll.MoveToFront(el)
	return e
}

// put caches a completed record for ttl.
func (c *replayCache) put(key KeyHash, fp Fingerprint, resp *Response, ttl time.Duration, now time.Time) {
	if c == nil || ttl <= 0 || resp == nil {
		return
	}
	size := int64(len(resp.Body)) + 256
	for k, v := range resp.Header {
		size += int64(len(k))
		for _, s := range v {
			size += int64(len(s))
		}
	}
	if size > c.max/8 {
		return // one entry never crowds out the rest
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.items[key]; el != nil {
		c.remove(el)
	}
	e := &cacheEntry{key: key, fp: fp, resp: resp, deadline: now.Add(ttl), size: size}
	c.items[key] = c.ll.PushFront(e)
	c.size += size
	for c.size > c.max {
		c.remove(c.ll.Back())
	}
}

func (c *replayCache) remove(el *list.Element) {
	e := el.Value.(*cacheEntry)
	c.ll.Remove(el)
	delete(c.items, e.key)
	c.size -= e.size
}
