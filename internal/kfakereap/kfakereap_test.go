package kfakereap_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/kfakereap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	topic = "t"
	// The dead member's session: short, so that the test waits little.
	deadSession = time.Second
	// The live member's: longer than the test, so that nothing but the
	// reaper's rule could remove it.
	liveSession = 2 * time.Minute
	// Attempts, each in its own group: kfake writes the dead member's
	// join answer to its closed connection's buffered channel or gives it
	// up, at random (a select on both), and only the latter leaves the
	// member without a session timer. Eight attempts all missing it has a
	// chance of 1/256.
	attempts = 8
)

// join sends a JoinGroup for memberID ("" for a new member, answered
// MEMBER_ID_REQUIRED and sent again with the id the broker gave), with the
// given session and rebalance timeout.
func join(ctx context.Context, cl *kgo.Client, group, memberID string, session time.Duration) (*kmsg.JoinGroupResponse, error) {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{topic}
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group, req.MemberID = group, memberID
	req.SessionTimeoutMillis = int32(session.Milliseconds())
	req.RebalanceTimeoutMillis = int32(session.Milliseconds())
	req.ProtocolType = "consumer"
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name = "cooperative-sticky"
	p.Metadata = meta.AppendTo(nil)
	req.Protocols = []kmsg.JoinGroupRequestProtocol{p}
	for {
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return nil, err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); errors.Is(err, kerr.MemberIDRequired) {
			req.MemberID = resp.MemberID
			continue
		} else if err != nil {
			return nil, err
		}
		return resp, nil
	}
}

// syncAll completes j: as the leader, every partition of topic goes to the
// first other member.
func syncAll(ctx context.Context, cl *kgo.Client, group string, j *kmsg.JoinGroupResponse) error {
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group, req.Generation, req.MemberID = group, j.Generation, j.MemberID
	req.ProtocolType, req.Protocol = kmsg.StringPtr("consumer"), j.Protocol
	given := false
	for _, m := range j.Members {
		a := kmsg.NewConsumerMemberAssignment()
		if m.MemberID != j.MemberID && !given {
			t := kmsg.NewConsumerMemberAssignmentTopic()
			t.Topic, t.Partitions = topic, []int32{0, 1}
			a.Topics = []kmsg.ConsumerMemberAssignmentTopic{t}
			given = true
		}
		ga := kmsg.NewSyncGroupRequestGroupAssignment()
		ga.MemberID, ga.MemberAssignment = m.MemberID, a.AppendTo(nil)
		req.GroupAssignment = append(req.GroupAssignment, ga)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}

// members describes group: its state and member ids.
func members(ctx context.Context, cl *kgo.Client, group string) (string, []string, error) {
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return "", nil, err
	}
	g := resp.Groups[0]
	if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
		return "", nil, err
	}
	var ids []string
	for _, m := range g.Members {
		ids = append(ids, m.MemberID)
	}
	return g.State, ids, nil
}

// joinSeen signals, per member id, that the broker has taken that member's
// JoinGroup (the control hook runs just before kfake handles it, on the
// same loop).
type joinSeen struct {
	mu    sync.Mutex
	waits map[string]chan struct{}
}

func (s *joinSeen) wait(id string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.waits[id]
	if ch == nil {
		ch = make(chan struct{})
		s.waits[id] = ch
	}
	return ch
}

func (s *joinSeen) saw(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch := s.waits[id]; ch != nil {
		close(ch)
		delete(s.waits, id)
	}
}

// deadMember builds, in group, the state of the chaos run's stall: the
// live member L is the group's leader; member D joins, and its JoinGroup
// waits for L to rejoin; D dies (its connection closes); L rejoins, which
// completes the join (kfake writes D's answer to the dead connection), and
// L syncs, giving D every partition. It returns D's and L's ids.
func deadMember(ctx context.Context, t *testing.T, addrs []string, seen *joinSeen, group string) (dead, live string) {
	t.Helper()
	lc, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Close)
	jl, err := join(ctx, lc, group, "", liveSession)
	if err != nil {
		t.Fatalf("L join: %v", err)
	}
	if err := syncAll(ctx, lc, group, jl); err != nil {
		t.Fatalf("L sync: %v", err)
	}
	dc, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group, req.ProtocolType = group, "consumer"
	req.SessionTimeoutMillis = int32(deadSession.Milliseconds())
	req.RebalanceTimeoutMillis = int32(deadSession.Milliseconds())
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name = "cooperative-sticky"
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{topic}
	p.Metadata = meta.AppendTo(nil)
	req.Protocols = []kmsg.JoinGroupRequestProtocol{p}
	first, err := req.RequestWith(ctx, dc)
	if err != nil || !errors.Is(kerr.ErrorForCode(first.ErrorCode), kerr.MemberIDRequired) {
		t.Fatalf("D first join: %v %v", err, kerr.ErrorForCode(first.ErrorCode))
	}
	dead = first.MemberID
	req.MemberID = dead
	taken := seen.wait(dead)
	held := make(chan struct{})
	go func() {
		defer close(held)
		_, _ = req.RequestWith(ctx, dc) // held by the broker until D dies
	}()
	select {
	case <-taken:
	case <-ctx.Done():
		t.Fatal("D's JoinGroup never reached the broker")
	}
	dc.Close() // D dies with its JoinGroup waiting
	<-held
	jl2, err := join(ctx, lc, group, jl.MemberID, liveSession)
	if err != nil {
		t.Fatalf("L rejoin: %v", err)
	}
	if !slices.ContainsFunc(jl2.Members, func(m kmsg.JoinGroupResponseMember) bool { return m.MemberID == dead }) {
		t.Fatalf("D is not in the completed join: %+v", jl2.Members)
	}
	if err := syncAll(ctx, lc, group, jl2); err != nil {
		t.Fatalf("L sync after D: %v", err)
	}
	return dead, jl.MemberID
}

// A member that dies while its JoinGroup waits is removed once its session
// times out, as Kafka does, and the live member stays: without the reaper,
// kfake keeps such a member in a Stable group for ever, holding the
// partitions it was given.
func TestDeadMemberWithAJoinInFlightIsEvicted(t *testing.T) {
	t.Parallel()
	seen := &joinSeen{waits: map[string]chan struct{}{}}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic), kfake.GroupMinSessionTimeout(deadSession))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		seen.saw(req.(*kmsg.JoinGroupRequest).MemberID)
		return nil, nil, false
	})
	r, err := kfakereap.Start(c, 100*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addrs := c.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	type pair struct{ group, dead, live string }
	var groups []pair
	for i := range attempts {
		g := fmt.Sprintf("g%d", i)
		d, l := deadMember(ctx, t, addrs, seen, g)
		groups = append(groups, pair{g, d, l})
	}
	for _, p := range groups {
		for {
			state, ids, err := members(ctx, cl, p.group)
			if err != nil {
				t.Fatalf("%s: describe: %v", p.group, err)
			}
			if !slices.Contains(ids, p.dead) {
				if !slices.Contains(ids, p.live) {
					t.Fatalf("%s: the live member was removed too (state %s, members %v)", p.group, state, ids)
				}
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: the dead member %s is still in the group (state %s, members %v): kfake kept it, and the partitions it was given are fetched by nobody", p.group, p.dead, state, ids)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// An old client (JoinGroup before v4, as kafka-go's v1 and v2) is named by
// the broker in its join's answer: the request the reaper sees carries no
// member id. Such a member that dies while its first JoinGroup waits is
// evicted all the same, after the session timeout its join asked for
// (the chaos matrix's kafka-go rows stalled on exactly that: the partitions
// given to the dead member were fetched by nobody).
func TestDeadOldClientWithItsFirstJoinInFlightIsEvicted(t *testing.T) {
	t.Parallel()
	seen := &joinSeen{waits: map[string]chan struct{}{}}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic), kfake.GroupMinSessionTimeout(deadSession))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if q := req.(*kmsg.JoinGroupRequest); q.GetVersion() < 4 {
			seen.saw("old:" + q.Group)
		}
		return nil, nil, false
	})
	r, err := kfakereap.Start(c, 100*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addrs := c.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	type pair struct{ group, dead, live string }
	var groups []pair
	for i := range attempts {
		group := fmt.Sprintf("old%d", i)
		lc, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(lc.Close)
		jl, err := join(ctx, lc, group, "", liveSession)
		if err != nil {
			t.Fatalf("L join: %v", err)
		}
		if err := syncAll(ctx, lc, group, jl); err != nil {
			t.Fatalf("L sync: %v", err)
		}
		// D speaks JoinGroup v3: no MEMBER_ID_REQUIRED round, its one
		// request waits for the rebalance and carries no member id.
		dc, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.MaxVersions(kversion.V2_1_0()))
		if err != nil {
			t.Fatal(err)
		}
		req := kmsg.NewPtrJoinGroupRequest()
		req.Group, req.ProtocolType = group, "consumer"
		req.SessionTimeoutMillis = int32(deadSession.Milliseconds())
		req.RebalanceTimeoutMillis = int32(deadSession.Milliseconds())
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name = "cooperative-sticky"
		meta := kmsg.NewConsumerMemberMetadata()
		meta.Topics = []string{topic}
		p.Metadata = meta.AppendTo(nil)
		req.Protocols = []kmsg.JoinGroupRequestProtocol{p}
		taken := seen.wait("old:" + group)
		held := make(chan struct{})
		go func() {
			defer close(held)
			_, _ = req.RequestWith(ctx, dc) // held by the broker until D dies
		}()
		select {
		case <-taken:
		case <-ctx.Done():
			t.Fatal("D's JoinGroup never reached the broker")
		}
		dc.Close() // D dies with its first JoinGroup waiting
		<-held
		jl2, err := join(ctx, lc, group, jl.MemberID, liveSession)
		if err != nil {
			t.Fatalf("L rejoin: %v", err)
		}
		dead := ""
		for _, m := range jl2.Members {
			if m.MemberID != jl.MemberID {
				dead = m.MemberID
			}
		}
		if dead == "" {
			t.Fatalf("D is not in the completed join: %+v", jl2.Members)
		}
		if err := syncAll(ctx, lc, group, jl2); err != nil {
			t.Fatalf("L sync after D: %v", err)
		}
		groups = append(groups, pair{group, dead, jl.MemberID})
	}
	for _, p := range groups {
		for {
			state, ids, err := members(ctx, cl, p.group)
			if err != nil {
				t.Fatalf("%s: describe: %v", p.group, err)
			}
			if !slices.Contains(ids, p.dead) {
				if !slices.Contains(ids, p.live) {
					t.Fatalf("%s: the live member was removed too (state %s, members %v)", p.group, state, ids)
				}
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: the dead old-protocol member %s is still in the group (state %s, members %v)", p.group, p.dead, state, ids)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
