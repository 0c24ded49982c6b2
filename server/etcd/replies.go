package etcd

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/statecast/statecast/store"
)

// Replies are bounded by bytes: a reply's keys and values are counted
// from the store's KVs before any of it is built (the values are the
// store's own slices until gRPC encodes them), and the server holds at
// most 16 replies of MaxReplyBytes at once, each until it is sent. A
// Range with a limit is a client that pages: it gets the keys that fit
// and more. Anything else past the bound is ResourceExhausted, before
// anything is written, as etcd answers a reply above its send limit.

// kvOverhead is what one KeyValue takes besides its key and value: its
// revisions, version, lease and framing.
const kvOverhead = 48

// kvBytes is what kv takes in a reply of room.
func kvBytes(room string, kv store.KV, keysOnly bool) int64 {
	n := int64(len(room) + 2 + len(kv.Key) + kvOverhead)
	if !keysOnly {
		n += int64(len(kv.Value))
	}
	return n
}

// kvsBytes is what kvs take in a reply of room.
func kvsBytes(room string, kvs []store.KV, keysOnly bool) int64 {
	var n int64
	for _, kv := range kvs {
		n += kvBytes(room, kv, keysOnly)
	}
	return n
}

// tooLarge is the error of a reply past MaxReplyBytes.
func (s *Server) tooLarge(what string, n int64, hint string) error {
	return status.Errorf(codes.ResourceExhausted, "statecast: %s would reply with %d bytes of keys and values, more than the %d a reply may hold: %s",
		what, n, s.maxReply, hint)
}

// pageBytes keeps of kvs what fits one reply: the first keys when the
// client pages (a Range with a limit: more tells it to ask for the rest,
// from the last key), all of them or an error otherwise. size is what
// the kept ones take.
func (s *Server) pageBytes(room string, kvs []store.KV, keysOnly, paging bool) (kept []store.KV, more bool, size int64, err error) {
	for i, kv := range kvs {
		n := kvBytes(room, kv, keysOnly)
		if size+n <= s.maxReply {
			size += n
			continue
		}
		if !paging || i == 0 {
			total := size + kvsBytes(room, kvs[i:], keysOnly)
			return nil, false, 0, s.tooLarge("this range", total, "read fewer keys at once: page with a limit (etcdctl get --limit), or narrow the range")
		}
		return kvs[:i], true, size, nil
	}
	return kvs, false, size, nil
}

// largest is what the n largest of sizes add up to: the most a range
// with limit n can reply, whatever its order.
func largest(sizes []int64, n int64) int64 {
	if n > 0 && int64(len(sizes)) > n {
		slices.Sort(sizes)
		sizes = sizes[int64(len(sizes))-n:]
	}
	var sum int64
	for _, v := range sizes {
		sum += v
	}
	return sum
}

// replyWait is how long a reply waits for the server's reply budget:
// replies to clients that do not read them hold it until their
// connections end, and the others are then refused, not kept waiting.
const replyWait = 10 * time.Second

// holdReply takes n bytes of the server's reply budget for ctx's RPC
// until its reply is sent, waiting while other replies hold it.
func (s *Server) holdReply(ctx context.Context, n int64) error {
	h, ok := ctx.Value(rpcKey{}).(*replyHold)
	if !ok || n <= 0 {
		return nil
	}
	wait, cancel := context.WithTimeout(ctx, s.replyWait)
	defer cancel()
	if err := s.replies.Acquire(wait, n); err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return status.Errorf(codes.ResourceExhausted, "statecast: the server is sending %d bytes of replies already; retry later", 16*s.maxReply)
	}
	h.n += n
	return nil
}

// dropReply gives back what ctx's RPC holds (its reply is not sent).
func (s *Server) dropReply(ctx context.Context) {
	if h, ok := ctx.Value(rpcKey{}).(*replyHold); ok && h.n > 0 {
		s.replies.Release(h.n)
		h.n = 0
	}
}
