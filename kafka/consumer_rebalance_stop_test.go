package kafka_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/kafka"
)

// joinCounter is a franz-go hook counting the JoinGroup requests a client
// writes, and signalling each.
type joinCounter struct {
	n    atomic.Int32
	sent chan struct{}
}

func (h *joinCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.JoinGroup) && err == nil {
		h.n.Add(1)
		select {
		case h.sent <- struct{}{}:
		default:
		}
	}
}

var _ kgo.HookBrokerWrite = (*joinCounter)(nil)

// commitSpy is a franz-go logger that signals each entry into
// CommitOffsetsSync (a debug line), so that a test knows an offset commit
// is in flight.
type commitSpy struct{ entered chan struct{} }

func (commitSpy) Level() kgo.LogLevel { return kgo.LogLevelDebug }

func (l commitSpy) Log(_ kgo.LogLevel, msg string, _ ...any) {
	if msg == "in CommitOffsetsSync" {
		select {
		case l.entered <- struct{}{}:
		default:
		}
	}
}

// rawJoin joins group as a bare member (what a SIGKILLed instance looks
// like to the broker: a member that joined and will never be heard from
// again), answering MEMBER_ID_REQUIRED. It returns the join's answer. It
// subscribes to topic: give one nobody produces to, so that the live
// members' balancer assigns it nothing (a cooperative revocation would
// start a second rebalance at once, held by this member too).
func rawJoin(ctx context.Context, cl *kgo.Client, group, topic string, session time.Duration) (*kmsg.JoinGroupResponse, error) {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{topic}
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group = group
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

// rawSync completes a bare member's join: as the leader it gives every
// partition of topic to the other members' first; as a follower it takes
// what it is given.
func rawSync(ctx context.Context, cl *kgo.Client, group, topic string, partitions int32, j *kmsg.JoinGroupResponse) error {
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group, req.Generation, req.MemberID = group, j.Generation, j.MemberID
	req.ProtocolType, req.Protocol = kmsg.StringPtr("consumer"), j.Protocol
	if j.LeaderID == j.MemberID {
		for _, m := range j.Members {
			a := kmsg.NewConsumerMemberAssignment()
			if m.MemberID != j.MemberID && len(req.GroupAssignment) == 0 {
				t := kmsg.NewConsumerMemberAssignmentTopic()
				t.Topic = topic
				for p := range partitions {
					t.Partitions = append(t.Partitions, p)
				}
				a.Topics = []kmsg.ConsumerMemberAssignmentTopic{t}
			}
			ga := kmsg.NewSyncGroupRequestGroupAssignment()
			ga.MemberID, ga.MemberAssignment = m.MemberID, a.AppendTo(nil)
			req.GroupAssignment = append(req.GroupAssignment, ga)
		}
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}

// The finding of the long chaos run: a SIGTERM that reaches an instance
// while its consumer group rebalances after a SIGKILL was unclean, the
// consumer stage cut off at its budget. Step by step, as the broker sees
// it:
//
//  1. member D (the instance that will be SIGKILLed) is in the group;
//     it dies without leaving, so the broker keeps it until its session
//     times out;
//  2. a member joins (the killed instance's restart), and the broker
//     starts a rebalance that waits for every member it knows to rejoin,
//     D included, until D's session (or the rebalance timeout) runs out;
//  3. the live member A rejoins and its JoinGroup is held by the broker;
//     franz-go holds A's offset commits and its group leave until that
//     join completes (the join runs on the client's context, not the
//     group's, so that a final commit stays possible);
//  4. A is stopped: its last commit and its leave each wait for the
//     rebalance, far beyond the stop's budget.
//
// The fix bounds the stop's last commit and leave by Stop's ctx: a commit
// that would wait for the rebalance is given up (the records are already
// in processed_event: the next owner re-reads and skips them), and a leave
// that cannot be sent in time abandons the held join (the broker drops A
// at its session timeout instead). Stop must then return within its ctx
// while the rebalance is still waiting for D.
func TestStopDuringARebalanceHeldByADeadMember(t *testing.T) {
	t.Parallel()
	b := consSetup(t, 2)
	ctx := context.Background()
	joins := &joinCounter{sent: make(chan struct{}, 1)}
	commits := commitSpy{entered: make(chan struct{}, 1)}
	processed := make(chan string, 16)
	handler := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if err := consEffectHandler("a")(ctx, tx, rec); err != nil {
			return err
		}
		processed <- string(rec.Value)
		return nil
	}
	c, err := kafka.NewConsumer(b.db.Pool, handler, &kafka.ConsumerConfig{
		Brokers: b.kc.Addrs, Group: b.group, Topics: []string{b.topic},
		ClientOpts: []kgo.Opt{kgo.HeartbeatInterval(100 * time.Millisecond), kgo.WithHooks(joins), kgo.WithLogger(commits)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = c.HardStop(ctx)
		}
	}()
	b.consProduce(t, 0, 1)
	<-processed

	// 1. D joins (a rebalance A takes part in) and syncs, then goes silent
	// with a session far longer than the stop's budget.
	const deadSession = 60 * time.Second
	dead := b.kc.Client(t)
	j, err := rawJoin(ctx, dead, b.group, b.topic+".none", deadSession)
	if err != nil {
		t.Fatalf("dead member's join: %v", err)
	}
	if err := rawSync(ctx, dead, b.group, b.topic, 2, j); err != nil {
		t.Fatalf("dead member's sync: %v", err)
	}
	// A is consuming again after that rebalance.
	b.consProduce(t, 1, 2)
	<-processed

	// 2. E joins: the broker rebalances and waits for D.
	before := joins.n.Load()
	ectx, ecancel := context.WithCancel(ctx)
	defer ecancel()
	eDone := make(chan struct{})
	go func() {
		defer close(eDone)
		_, _ = rawJoin(ectx, b.kc.Client(t), b.group, b.topic+".none", 10*time.Second)
	}()
	// 3. A rejoins; the broker holds its JoinGroup.
	for joins.n.Load() == before {
		select {
		case <-joins.sent:
		case <-eDone:
			t.Fatal("E's join ended before A rejoined")
		}
	}
	// A record A processes while its join is held: its commit waits for
	// the rebalance, and is in flight when the stop comes.
	select {
	case <-commits.entered: // an earlier commit's
	default:
	}
	b.consProduce(t, 2, 3)
	select {
	case <-processed:
	case <-eDone:
		t.Fatal("E's join ended before A processed its record")
	}
	select {
	case <-commits.entered:
	case <-eDone:
		t.Fatal("E's join ended before A's commit began")
	}

	// 4. The stop, on a budget far below D's session.
	sctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	err = c.Stop(sctx)
	if err == nil {
		stopped = true
	}
	select {
	case <-eDone:
		t.Fatal("the rebalance completed before the stop returned: the test did not hold it")
	default:
	}
	if err != nil {
		t.Fatalf("Stop during a rebalance held by a dead member: %v (its commit or leave waited for the rebalance)", err)
	}
	// E's join is still held: end it, and the clients, before goleak looks.
	ecancel()
	<-eDone
}
