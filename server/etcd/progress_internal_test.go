package etcd

import (
	"context"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/store"
)

// recordingStream is a Watch stream that records what is sent: the last
// event revision of each response with events, or the revision of each
// progress response.
type recordingStream struct {
	grpc.ServerStream
	ctx       context.Context
	lastEvent int64 // of the responses with events so far
	progress  []int64
}

func (r *recordingStream) Context() context.Context { return r.ctx }

func (r *recordingStream) Send(resp *pb.WatchResponse) error {
	r.progress = append(r.progress, resp.Header.Revision)
	return nil
}

func (r *recordingStream) SendMsg(m any) error {
	var b encoded
	switch m := m.(type) {
	case heldEncoded:
		b = m.b
		m.release()
	case encoded:
		b = m
	default:
		return fmt.Errorf("unexpected message %T", m)
	}
	var resp pb.WatchResponse
	if err := proto.Unmarshal(b, &resp); err != nil {
		return err
	}
	r.lastEvent = resp.Events[len(resp.Events)-1].Kv.ModRevision
	return nil
}

func (r *recordingStream) Recv() (*pb.WatchRequest, error) { select {} }

// TestProgressWhileFallenBehind: a progress response at R tells the
// client every event up to R was sent. A watch that fell behind replays
// what it missed in chunks; a progress request answered meanwhile sent
// the head after the first chunk, with later revisions still unsent
// (found by review). It now drains the replay first.
func TestProgressWhileFallenBehind(t *testing.T) {
	o := servertest.Options{}
	o.Rooms.QueueLimit, o.Rooms.ReplayChunk = 2, 3
	n := servertest.Start(t, o)
	s := New(Config{Node: n.Server})
	ctx := context.Background()
	first, err := n.Engine.Apply(ctx, "p", store.Put("k", []byte(`"0"`)))
	if err != nil {
		t.Fatal(err)
	}
	head0, err := n.Engine.Get(ctx, "p", "", rooms.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := &recordingStream{ctx: ctx}
	ws := &watchStream{s: s, ctx: ctx, stream: st, watches: map[int64]*watch{}, holds: map[*budgetHold]struct{}{}, conn: s.newConnState()}
	w := &watch{id: 1, sp: span{room: "p", pre: "/p/", open: true}, epoch: head0.Epoch, notify: true, last: first.Rev,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.ctx, w.cancel = context.WithCancel(ctx)
	defer w.cancel()
	if !ws.start(w) {
		t.Fatal("the watch did not start")
	}
	defer w.rw.Close()
	for !w.synced { // live at the head
		msgs, err := w.rw.Drain(nil)
		if err != nil {
			t.Fatal(err)
		}
		ws.deliver(w, msgs)
	}
	var head uint64
	for i := range 20 { // its queue holds 2: it falls behind
		res, err := n.Engine.Apply(ctx, "p", store.Put("k", []byte(fmt.Sprintf(`"%d"`, i))))
		if err != nil {
			t.Fatal(err)
		}
		head = res.Rev
	}
	if !ws.progressNow(w) {
		t.Fatal("the watch ended")
	}
	if len(st.progress) == 0 {
		t.Fatal("no progress response")
	}
	for _, rev := range st.progress {
		if rev > st.lastEvent {
			t.Fatalf("a progress response at %d with events sent up to %d only", rev, st.lastEvent)
		}
	}
	if st.lastEvent != etcdRev(head) {
		t.Errorf("events sent up to %d, want the head %d", st.lastEvent, etcdRev(head))
	}
}
