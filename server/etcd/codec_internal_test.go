package etcd

import (
	"bytes"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// A watch response built from marshaled events is byte for byte what
// gRPC's proto codec sends for the same message, and the codec passes it
// through unchanged while it still marshals every other message.
func TestWatchResponseIsProtoMarshal(t *testing.T) {
	evs := []*mvccpb.Event{
		{Type: mvccpb.Event_PUT, Kv: &mvccpb.KeyValue{Key: []byte("/r/k"), Value: []byte("v"), CreateRevision: 2, ModRevision: 5, Version: 3, Lease: 7}},
		{Type: mvccpb.Event_DELETE, Kv: &mvccpb.KeyValue{Key: []byte("/r/j"), ModRevision: 5}},
		{Type: mvccpb.Event_PUT, Kv: &mvccpb.KeyValue{Key: []byte("/r/\xff"), Value: bytes.Repeat([]byte{0}, 300), CreateRevision: 1 << 40, ModRevision: 1 << 40, Version: 1},
			PrevKv: &mvccpb.KeyValue{Key: []byte("/r/\xff"), Value: []byte("old"), CreateRevision: 1 << 40, ModRevision: 4, Version: 9}},
	}
	var encs [][]byte
	for _, e := range evs {
		b, err := proto.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		encs = append(encs, b)
	}
	c := newCodec()
	for _, h := range []*pb.ResponseHeader{
		{ClusterId: 1<<63 + 5, MemberId: 9, Revision: 5, RaftTerm: 1},
		{Revision: 1},
	} {
		for _, id := range []int64{0, 1, 1 << 40, -1} {
			for _, n := range []int{0, 1, len(evs)} {
				want, err := proto.MarshalOptions{Deterministic: true}.Marshal(&pb.WatchResponse{Header: h, WatchId: id, Events: evs[:n]})
				if err != nil {
					t.Fatal(err)
				}
				got := watchResponse(h, id, encs[:n])
				if !bytes.Equal(got, want) {
					t.Errorf("header %v, id %d, %d events:\n got %x\nwant %x", h, id, n, got, want)
				}
				out, err := c.Marshal(got)
				if err != nil || !bytes.Equal(out.Materialize(), want) {
					t.Errorf("the codec changed an encoded response (%v)", err)
				}
			}
		}
	}
	out, err := c.Marshal(&pb.WatchResponse{WatchId: 3})
	if err != nil {
		t.Fatal(err)
	}
	var back pb.WatchResponse
	if err := c.Unmarshal(out, &back); err != nil || back.WatchId != 3 {
		t.Errorf("a message through the codec: %v, %v", &back, err)
	}
}

// TestBudgetHoldsReleasedOnce: what a stream's sent responses hold goes
// back when gRPC frees them or, for those it dropped unfreed (a frame of
// a canceled stream), when the stream ends; a free after that releases
// nothing twice (the semaphore would panic).
func TestBudgetHoldsReleasedOnce(t *testing.T) {
	s := &Server{maxWatchQ: 1000}
	ws := &watchStream{s: s, conn: s.newConnState(), holds: make(map[*budgetHold]struct{})}
	var hs []*budgetHold
	for range 4 {
		if !ws.conn.queued.TryAcquire(250) {
			t.Fatal("budget taken")
		}
		h := &budgetHold{ws: ws, n: 250}
		ws.holds[h] = struct{}{}
		hs = append(hs, h)
	}
	hs[0].release() // written: gRPC freed it
	if len(ws.holds) != 3 {
		t.Fatalf("%d holds left, want 3", len(ws.holds))
	}
	ws.releaseHolds() // the stream ended with three unfreed
	for _, h := range hs {
		h.release() // gRPC's late frees
	}
	if !ws.conn.queued.TryAcquire(1000) {
		t.Fatal("the connection's budget did not all come back")
	}
}
