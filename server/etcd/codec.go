package etcd

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// encoded is a message already in its wire form. A watch response is
// built from events marshaled once per connection (eventCache) and
// shared by every watch of the same key, where gRPC's codec would marshal
// the events again for each watch: etcd's clients watch a key many times
// over (locks, elections, observers), and marshaling took about a fifth
// of the node's CPU per event delivered (BenchmarkWatchFanout).
type encoded []byte

// codec is gRPC's proto codec that sends an encoded message as it is.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2(proto.Name)} }

// heldEncoded is an encoded message that holds budget until gRPC has
// written it: release is called then (or when the stream ends first).
type heldEncoded struct {
	b       encoded
	release func()
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case encoded:
		return mem.BufferSlice{mem.SliceBuffer(m)}, nil
	case heldEncoded:
		// gRPC frees a message's buffer once its transport has written it
		// (or dropped it with its stream): the budget goes back then, not
		// when SendMsg returns, which it does with the message still
		// queued behind the client's flow control. A buffer too small for
		// gRPC to track is freed at once.
		b := []byte(m.b)
		if mem.IsBelowBufferPoolingThreshold(cap(b)) {
			m.release()
			return mem.BufferSlice{mem.SliceBuffer(b)}, nil
		}
		return mem.BufferSlice{mem.NewBuffer(&b, releaseOnFree(m.release))}, nil
	}
	return c.proto.Marshal(v)
}

// releaseOnFree is a mem.BufferPool of one buffer: its Put, which gRPC
// calls when the buffer is freed, releases what the message held.
type releaseOnFree func()

func (r releaseOnFree) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (r releaseOnFree) Put(*[]byte)       { r() }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

func (codec) Name() string { return proto.Name }

// Field numbers of etcd's WatchResponse and ResponseHeader (rpc.proto).
const (
	fieldHeader  = 1
	fieldWatchID = 2
	fieldEvents  = 11

	fieldClusterID = 1
	fieldMemberID  = 2
	fieldRevision  = 3
	fieldRaftTerm  = 4
)

// watchResponse encodes a WatchResponse of header h, watch id and the
// events (each a marshaled mvccpb.Event), as proto.Marshal of the same
// message would.
func watchResponse(h *pb.ResponseHeader, id int64, events [][]byte) encoded {
	var hdr [4 * (1 + 10)]byte // four varint fields of at most 10 bytes
	hb := appendVarintField(hdr[:0], fieldClusterID, h.ClusterId)
	hb = appendVarintField(hb, fieldMemberID, h.MemberId)
	hb = appendVarintField(hb, fieldRevision, uint64(h.Revision))
	hb = appendVarintField(hb, fieldRaftTerm, h.RaftTerm)
	n := protowire.SizeTag(fieldHeader) + protowire.SizeBytes(len(hb)) + protowire.SizeTag(fieldWatchID) + protowire.SizeVarint(uint64(id))
	for _, e := range events {
		n += protowire.SizeTag(fieldEvents) + protowire.SizeBytes(len(e))
	}
	b := make([]byte, 0, n)
	b = protowire.AppendTag(b, fieldHeader, protowire.BytesType)
	b = protowire.AppendBytes(b, hb)
	b = appendVarintField(b, fieldWatchID, uint64(id))
	for _, e := range events {
		b = protowire.AppendTag(b, fieldEvents, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}

// appendVarintField appends field num holding v, or nothing when v is 0
// (proto3 leaves zero values out).
func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}
