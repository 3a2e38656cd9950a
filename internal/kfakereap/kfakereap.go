// Package kfakereap makes kfake expire a consumer group member the way
// Kafka does: one that sends nothing for its session timeout after the
// group settled is removed, and the group rebalances.
//
// kfake (the in-process broker of devkafka and internal/testkafka) arms a
// member's session timer only when a reply reaches it. A member that dies
// while its JoinGroup waits for the rebalance (a SIGKILL, or a stop that
// abandons the join in flight) gets the join's answer written to a closed
// connection: kfake then has no timer for it. When the group's leader
// syncs first, kfake also drops the timer that removes members that never
// sync, and the group is Stable with the dead member in it, holding the
// partitions the leader gave it. No member fetches them and no other member
// takes them over until some other join or leave rebalances the group:
// a chaos run with every instance up stalled for minutes on exactly that.
// Kafka arms the session expiry of every member when the join completes,
// whether its answer was delivered or not.
//
// A Reaper watches the group requests (JoinGroup, SyncGroup, Heartbeat,
// OffsetCommit, LeaveGroup) through kfake's control hooks, without
// changing them, and every interval describes the groups it saw: a member
// of a Stable group that has sent nothing for its session timeout since
// the group last settled (its last SyncGroup) is removed with a LeaveGroup
// naming it, as Kafka's expiry would. A live member heartbeats well within
// its session timeout, so it is never touched.
package kfakereap

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// IntervalDefault is how often Start's reaper looks at the groups.
const IntervalDefault = 500 * time.Millisecond

// Reason is the LeaveGroup reason of an eviction (LeaveGroup v5+).
const Reason = "kfakereap: no request within the session timeout"

type member struct {
	seen    time.Time     // last group request naming it
	session time.Duration // from its JoinGroup; 0: unknown, never reaped
}

type group struct {
	settled time.Time // last SyncGroup
	// oldJoinSession is the longest session timeout of the group's
	// unnamed JoinGroups before v4: the session of a member the reaper
	// never saw join under its id (such an old client, kafka-go's v1 and
	// v2, is named in the answer of a request that carried no id; from v4
	// an unnamed join is only answered MEMBER_ID_REQUIRED and the client
	// joins again, named).
	oldJoinSession time.Duration
	members        map[string]*member
}

// Reaper evicts dead members kfake keeps; see the package doc.
type Reaper struct {
	seeds    []string
	interval time.Duration
	now      func() time.Time
	onEvict  func(group, member string)

	mu     sync.Mutex
	groups map[string]*group

	cancel context.CancelFunc
	done   chan struct{}
}

// Start installs the reaper's control hooks on c and starts its loop, which
// looks at the groups every interval (IntervalDefault when 0). onEvict, if
// not nil, is called after each eviction (from the loop's goroutine). Stop
// it before closing c.
func Start(c *kfake.Cluster, interval time.Duration, onEvict func(group, member string)) (*Reaper, error) {
	if interval <= 0 {
		interval = IntervalDefault
	}
	seeds := c.ListenAddrs()
	probe, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return nil, err // bad seeds: every sweep would fail the same way
	}
	probe.Close()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Reaper{
		seeds: seeds, interval: interval, now: time.Now, onEvict: onEvict,
		groups: map[string]*group{},
		cancel: cancel, done: make(chan struct{}),
	}
	for _, k := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.OffsetCommit, kmsg.LeaveGroup} {
		c.ControlKey(int16(k), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			r.observe(req)
			return nil, nil, false // kfake handles it as usual
		})
	}
	go r.loop(ctx)
	return r, nil
}

// Stop ends the loop. The control hooks stay (they only record); safe to
// call twice.
func (r *Reaper) Stop() {
	r.cancel()
	<-r.done
}

func (r *Reaper) groupLocked(name string) *group {
	g := r.groups[name]
	if g == nil {
		g = &group{members: map[string]*member{}}
		r.groups[name] = g
	}
	return g
}

func (r *Reaper) seen(g *group, id string, now time.Time) *member {
	m := g.members[id]
	if m == nil {
		m = &member{}
		g.members[id] = m
	}
	m.seen = now
	return m
}

// observe records a group request: who sent it, when, with what session
// timeout, and when the group last settled.
func (r *Reaper) observe(req kmsg.Request) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch q := req.(type) {
	case *kmsg.JoinGroupRequest:
		g := r.groupLocked(q.Group)
		session := time.Duration(q.SessionTimeoutMillis) * time.Millisecond
		if q.MemberID == "" {
			// The broker has not named it yet.
			if q.GetVersion() < 4 {
				g.oldJoinSession = max(g.oldJoinSession, session)
			}
			return
		}
		r.seen(g, q.MemberID, now).session = session
	case *kmsg.SyncGroupRequest:
		g := r.groupLocked(q.Group)
		r.seen(g, q.MemberID, now)
		g.settled = now
	case *kmsg.HeartbeatRequest:
		r.seen(r.groupLocked(q.Group), q.MemberID, now)
	case *kmsg.OffsetCommitRequest:
		if q.MemberID != "" {
			r.seen(r.groupLocked(q.Group), q.MemberID, now)
		}
	case *kmsg.LeaveGroupRequest:
		g := r.groupLocked(q.Group)
		delete(g.members, q.MemberID)
		for _, lm := range q.Members {
			delete(g.members, lm.MemberID)
		}
	}
}

func (r *Reaper) loop(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.sweep(ctx)
	}
}

// sweep describes the groups seen and evicts the expired members of the
// Stable ones. Its client lives for one sweep: no connection of the
// reaper's outlasts it (a test's proxy in front of the broker waits for
// its connections to end before the cluster closes).
func (r *Reaper) sweep(ctx context.Context) {
	r.mu.Lock()
	names := make([]string, 0, len(r.groups))
	for n := range r.groups {
		names = append(names, n)
	}
	r.mu.Unlock()
	if len(names) == 0 {
		return
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.seeds...))
	if err != nil {
		return
	}
	defer cl.Close()
	dreq := kmsg.NewPtrDescribeGroupsRequest()
	dreq.Groups = names
	dresp, err := dreq.RequestWith(ctx, cl)
	if err != nil {
		return // the broker is stopping, or busy: next time
	}
	for _, dg := range dresp.Groups {
		if dg.ErrorCode != 0 || dg.State != "Stable" {
			continue
		}
		for _, id := range r.expired(dg.Group, dg.Members) {
			lreq := kmsg.NewPtrLeaveGroupRequest()
			lreq.Group = dg.Group
			lreq.MemberID = id // LeaveGroup v0-v2
			lm := kmsg.NewLeaveGroupRequestMember()
			lm.MemberID = id
			lm.Reason = kmsg.StringPtr(Reason)
			lreq.Members = []kmsg.LeaveGroupRequestMember{lm}
			if _, err := lreq.RequestWith(ctx, cl); err == nil && r.onEvict != nil {
				r.onEvict(dg.Group, id)
			}
		}
	}
}

// expired returns the members of the described group whose session ran
// out: nothing from them for their session timeout since they were last
// seen or the group last settled, whichever is later. A member never seen
// starts its clock now. A member whose own session timeout is unknown (it
// never joined under its id) gets the longest one the group's unnamed old
// joins asked for; with none known it is never evicted.
func (r *Reaper) expired(name string, described []kmsg.DescribeGroupsResponseGroupMember) []string {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groupLocked(name)
	var out []string
	for _, dm := range described {
		m := g.members[dm.MemberID]
		if m == nil {
			g.members[dm.MemberID] = &member{seen: now}
			continue
		}
		session := m.session
		if session <= 0 {
			session = g.oldJoinSession
		}
		if session <= 0 {
			continue
		}
		since := m.seen
		if g.settled.After(since) {
			since = g.settled
		}
		if now.Sub(since) > session {
			out = append(out, dm.MemberID)
		}
	}
	return out
}
