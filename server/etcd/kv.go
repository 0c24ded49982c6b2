package etcd

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

type kvServer struct {
	pb.UnimplementedKVServer
	*Server
}

// read returns the keys of sp at etcd revision rev (≤ 0: the head), read
// as ro says; the snapshot's Rev is the room's head, as etcd's header
// revision is.
func (s *Server) read(ctx context.Context, sp span, rev int64, ro rooms.ReadOptions) (store.Snapshot, error) {
	var snap store.Snapshot
	var err error
	if sp.single && rev <= 0 {
		snap, err = s.engine.Get(ctx, sp.room, sp.lo, ro)
	} else { // the span's keys, not every key under the prefix its ends share
		from, to := sp.walkBounds()
		snap, err = s.engine.ListRanges(ctx, sp.room, []rooms.KeyRange{{Lo: from, Hi: to}}, ro)
	}
	if err != nil {
		return snap, grpcError(err)
	}
	if rev > 0 { // etcd: a revision ≤ 0 is the head
		switch at := roomRev(rev); {
		case at > snap.Rev:
			return snap, rpctypes.ErrGRPCFutureRev
		case at < snap.Rev:
			if snap.Items, err = s.undo(ctx, sp, snap, at); err != nil {
				return snap, err
			}
		}
	}
	snap.Items = slices.DeleteFunc(snap.Items, func(kv store.KV) bool { return !sp.has(kv.Key) })
	return snap, nil
}

// undo turns snap's items into the keys at rev: the room keeps no past
// states, but its history keeps every event with the key's previous
// version, so the events after rev are undone, newest first. A rev below
// the oldest retained revision is compacted, as in etcd (where Compact(c)
// keeps c readable and refuses c-1, though the events from c on could
// rebuild it): the replay starts at rev itself.
func (s *Server) undo(ctx context.Context, sp span, snap store.Snapshot, rev uint64) ([]store.KV, error) {
	w, err := s.engine.Watch(ctx, sp.room, rooms.WatchOptions{Prefixes: []string{sp.prefix()},
		From: &rooms.Position{Epoch: snap.Epoch, Rev: max(rev, 1)}, FailIfCompacted: true, Exact: true}) // rev 0: the empty room
	if err != nil {
		return nil, grpcError(err)
	}
	defer w.Close()
	var changes []*rooms.Change
	for done := false; !done; {
		m, err := w.Next(ctx)
		if err != nil {
			return nil, grpcError(err)
		}
		switch {
		case m.Kind == rooms.KindEvents && m.Rev <= rev: // rev's own state stays
		case m.Kind == rooms.KindEvents && m.Rev <= snap.Rev:
			changes = append(changes, m.Change)
			done = m.Rev == snap.Rev
		case m.Kind == rooms.KindEvents, m.Kind == rooms.KindSynced, m.Kind == rooms.KindProgress:
			done = m.Rev >= snap.Rev
		default: // a catch-up, which an exact watcher is never sent
			return nil, rpctypes.ErrGRPCCompacted
		}
	}
	keys := make(map[string]store.KV, len(snap.Items))
	for _, kv := range snap.Items {
		keys[kv.Key] = kv
	}
	for i := len(changes) - 1; i >= 0; i-- {
		evs := changes[i].Events
		for j := len(evs) - 1; j >= 0; j-- {
			if ev := evs[j]; ev.Prev != nil {
				keys[ev.KV.Key] = *ev.Prev
			} else {
				delete(keys, ev.KV.Key)
			}
		}
	}
	items := make([]store.KV, 0, len(keys))
	for _, kv := range keys {
		items = append(items, kv)
	}
	slices.SortFunc(items, func(a, b store.KV) int { return strings.Compare(a.Key, b.Key) })
	return items, nil
}

func (s kvServer) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	sp, err := s.parseSpan(r.Key, r.RangeEnd)
	if err != nil {
		if k := string(r.Key); len(r.RangeEnd) == 0 && !(strings.HasPrefix(k, "/") && strings.Contains(k[1:], "/")) {
			// A key outside every room exists in none: etcdctl endpoint
			// health reads "health" and counts any answer as healthy.
			return &pb.RangeResponse{Header: s.header(0)}, nil
		}
		return nil, err
	}
	if err := sp.canRead(c); err != nil {
		return nil, err
	}
	if walked(sp, r) {
		return s.rangeWalk(ctx, sp, r)
	}
	snap, err := s.read(ctx, sp, r.Revision, rooms.ReadOptions{Serializable: r.Serializable})
	if err != nil {
		return nil, err
	}
	kvs, count, more := rangeKVs(snap.Items, false, r)
	kvs, paged, size, err := s.pageBytes(sp.room, kvs, r.KeysOnly, r.Limit > 0)
	if err != nil {
		return nil, err
	}
	if err := s.holdReply(ctx, size); err != nil {
		return nil, err
	}
	return s.rangeResponse(sp.pre, kvs, count, more || paged, snap.Rev, r), nil
}

// walked says whether r is answered by a walk of the view (rangeWalk):
// a count, or a limit in key order, with no revision filter.
func walked(sp span, r *pb.RangeRequest) bool {
	return !sp.single && (r.CountOnly || r.Limit > 0) && r.Revision != 1 && // 1: the empty room (roomRev 0, the head to a walk)
		r.SortTarget == pb.RangeRequest_KEY && r.SortOrder != pb.RangeRequest_DESCEND &&
		r.MinModRevision == 0 && r.MaxModRevision == 0 && r.MinCreateRevision == 0 && r.MaxCreateRevision == 0
}

// rangeWalk answers r by walking the view once, counting the span's keys
// and keeping the first r.Limit: it costs the walk (at a past revision,
// with the retained events since), not a copy of the room's keys, which
// a count or a page of a large room paid before.
func (s kvServer) rangeWalk(ctx context.Context, sp span, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	var count int64
	var kvs []store.KV
	var at uint64
	if r.Revision > 0 { // etcd: a revision ≤ 0 is the head
		at = roomRev(r.Revision)
	}
	walk := rooms.PageOptions{Rev: at, Keep: func(kv store.KV) bool {
		if sp.has(kv.Key) {
			count++
			if !r.CountOnly && count <= r.Limit {
				kvs = append(kvs, kv)
			}
		}
		return false // nothing for the page: what is kept is here
	}}
	walk.From, walk.To = sp.walkBounds()
	page, err := s.engine.ListPage(ctx, sp.room, sp.prefix(), walk, rooms.ReadOptions{Serializable: r.Serializable})
	if err != nil {
		return nil, grpcError(err)
	}
	if at > 0 && at < page.Head && at < page.Oldest { // as a full read: below the head, the oldest retained revision is the first readable
		return nil, rpctypes.ErrGRPCCompacted
	}
	if r.CountOnly {
		return &pb.RangeResponse{Header: s.header(page.Head), Count: count}, nil
	}
	kvs, paged, size, err := s.pageBytes(sp.room, kvs, r.KeysOnly, true)
	if err != nil {
		return nil, err
	}
	if err := s.holdReply(ctx, size); err != nil {
		return nil, err
	}
	return s.rangeResponse(sp.pre, kvs, count, count > int64(len(kvs)) || paged, page.Head, r), nil
}

// rangeKVs selects what r returns of items (sorted by key): its filters,
// order and limit applied; count is etcd's, more says the limit left
// keys out. Items that are shared are copied before they are filtered or
// sorted.
func rangeKVs(items []store.KV, shared bool, r *pb.RangeRequest) (kvs []store.KV, count int64, more bool) {
	count = int64(len(items)) // etcd counts before the revision filters
	if r.CountOnly {
		return nil, count, false
	}
	order := r.SortOrder
	if order == pb.RangeRequest_NONE && r.SortTarget != pb.RangeRequest_KEY {
		order = pb.RangeRequest_ASCEND // as etcd does
	}
	if shared && (order != pb.RangeRequest_NONE || r.MinModRevision > 0 || r.MaxModRevision > 0 || r.MinCreateRevision > 0 || r.MaxCreateRevision > 0) {
		items = slices.Clone(items)
	}
	items = slices.DeleteFunc(items, func(kv store.KV) bool {
		return r.MinModRevision > 0 && keyRev(kv.ModRev) < r.MinModRevision ||
			r.MaxModRevision > 0 && keyRev(kv.ModRev) > r.MaxModRevision ||
			r.MinCreateRevision > 0 && keyRev(kv.CreateRev) < r.MinCreateRevision ||
			r.MaxCreateRevision > 0 && keyRev(kv.CreateRev) > r.MaxCreateRevision
	})
	switch {
	case order != pb.RangeRequest_NONE && r.SortTarget == pb.RangeRequest_VALUE:
		sortByValue(items, order == pb.RangeRequest_DESCEND)
	case order != pb.RangeRequest_NONE:
		slices.SortStableFunc(items, func(a, b store.KV) int {
			n := compareBy(r.SortTarget, a, b)
			if order == pb.RangeRequest_DESCEND {
				n = -n
			}
			return n
		})
	}
	if r.Limit > 0 && int64(len(items)) > r.Limit {
		items, more = items[:r.Limit], true
	}
	return items, count, more
}

// rangeResponse answers r with kvs (from rangeKVs) of the span pre names.
func (s *Server) rangeResponse(pre string, kvs []store.KV, count int64, more bool, rev uint64, r *pb.RangeRequest) *pb.RangeResponse {
	resp := &pb.RangeResponse{Header: s.header(rev), Count: count, More: more}
	if len(kvs) > 0 {
		resp.Kvs = make([]*mvccpb.KeyValue, len(kvs))
	}
	for i, kv := range kvs {
		resp.Kvs[i] = toKV(pre, kv, r.KeysOnly)
	}
	return resp
}

func compareBy(t pb.RangeRequest_SortTarget, a, b store.KV) int {
	switch t {
	case pb.RangeRequest_VERSION:
		return cmp.Compare(a.Version, b.Version)
	case pb.RangeRequest_CREATE:
		return cmp.Compare(a.CreateRev, b.CreateRev)
	case pb.RangeRequest_MOD:
		return cmp.Compare(a.ModRev, b.ModRev)
	}
	return strings.Compare(a.Key, b.Key)
}

// sortByValue sorts items stably by their etcd bytes, as etcd compares
// values. Each value is turned into its bytes once: a value with escapes
// is decoded, and decoding at each comparison cost a range of 40,000
// such keys seconds of CPU.
func sortByValue(items []store.KV, descend bool) {
	type keyed struct {
		v  []byte
		kv store.KV
	}
	ks := make([]keyed, len(items))
	for i, kv := range items {
		ks[i] = keyed{fromValue(kv.Value), kv}
	}
	slices.SortStableFunc(ks, func(a, b keyed) int {
		if descend {
			return bytes.Compare(b.v, a.v)
		}
		return bytes.Compare(a.v, b.v)
	})
	for i := range ks {
		items[i] = ks[i].kv
	}
}

// putOp turns a put into a store op.
func (s *Server) putOp(r *pb.PutRequest) (span, store.Op, error) {
	sp, err := s.parseSpan(r.Key, nil)
	if err != nil {
		return sp, store.Op{}, err
	}
	if sp.lo == "" {
		return sp, store.Op{}, status.Errorf(codes.InvalidArgument, "statecast: key %q names a room and no key in it: /<room>/<key>", r.Key)
	}
	// etcd's checks and semantics: either flag needs the key to exist
	// (checked in the store's atomic step: MustExist).
	switch {
	case r.IgnoreValue && len(r.Value) > 0:
		return sp, store.Op{}, rpctypes.ErrGRPCValueProvided
	case r.IgnoreLease && r.Lease != 0:
		return sp, store.Op{}, rpctypes.ErrGRPCLeaseProvided
	}
	op := store.Op{Type: store.OpPut, Key: sp.lo, KeepLease: r.IgnoreLease, KeepValue: r.IgnoreValue, MustExist: r.IgnoreLease || r.IgnoreValue}
	if r.Lease != 0 {
		op.Lease = leaseName(r.Lease)
	}
	if r.IgnoreValue {
		return sp, op, nil
	}
	v, err := toValue(r.Value)
	if err != nil {
		return sp, store.Op{}, err
	}
	// The limit is the room's, on the value as stored: etcd's bytes as a
	// JSON string (escapes take up to 6 bytes a byte) or in base64.
	if limit := s.limits.WithDefaults().MaxValueBytes; len(v) > limit {
		return sp, store.Op{}, status.Errorf(codes.InvalidArgument,
			"statecast: a value of %d bytes takes %d bytes as a room's JSON value, more than the %d a value may take (serve --max-value raises it)", len(r.Value), len(v), limit)
	}
	op.Value = v
	return sp, op, nil
}

func (s kvServer) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	sp, op, err := s.putOp(r)
	if err != nil {
		return nil, err
	}
	if r.PrevKv { // the previous value is a read
		if err := sp.canRead(c); err != nil {
			return nil, err
		}
	}
	res, err := s.node.Write(ctx, sp.room, store.Write{Ops: []store.Op{op}}, c.claims, c.addr)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &pb.PutResponse{Header: s.header(res.Rev)}
	if r.PrevKv && len(res.Events) == 1 && res.Events[0].Prev != nil {
		resp.PrevKv = toKV(sp.pre, *res.Events[0].Prev, false)
	}
	return resp, nil
}

func (s kvServer) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	sp, err := s.parseSpan(r.Key, r.RangeEnd)
	if err != nil {
		return nil, err
	}
	if sp.single && sp.lo == "" {
		return nil, status.Errorf(codes.InvalidArgument, "statecast: key %q names a room and no key in it: /<room>/<key> (a prefix: --prefix /<room>/)", r.Key)
	}
	// The previous values are a read, and so is a range: which keys it
	// holds, and how many. Both are checked before anything is read, so a
	// refusal tells nothing of the room.
	if r.PrevKv || !sp.single {
		if err := sp.canRead(c); err != nil {
			return nil, err
		}
	}
	if !sp.single && !c.claims.CanWrite(sp.room, sp.prefix()) {
		return nil, status.Error(codes.PermissionDenied, fmt.Sprintf("statecast: the token does not allow writing %q in room %q", sp.prefix(), sp.room))
	}
	w := store.Delete(sp.lo)
	if !sp.single {
		// The keys the range holds now, each deleted if still there: a
		// key created meanwhile is left (it is as if created just after).
		// One write deletes them, as etcd does at one revision: more keys
		// than a write may hold are refused, not deleted in parts, and the
		// walk stops there rather than read the whole range first.
		limit := s.limits.WithDefaults().MaxOps
		o := rooms.PageOptions{Limit: limit, Keep: func(kv store.KV) bool { return sp.has(kv.Key) }}
		o.From, o.To = sp.walkBounds()
		snap, err := s.engine.ListPage(ctx, sp.room, sp.prefix(), o, rooms.ReadOptions{})
		if err != nil {
			return nil, grpcError(err)
		}
		if len(snap.Items) == 0 {
			return &pb.DeleteRangeResponse{Header: s.header(snap.Rev)}, nil
		}
		if snap.More {
			return nil, status.Errorf(codes.InvalidArgument,
				"statecast: this delete would remove more keys in one write than the %d a write may hold: delete in smaller ranges, or serve with a larger --max-ops", limit)
		}
		if r.PrevKv { // refused before anything is deleted
			n := kvsBytes(sp.room, snap.Items, false)
			if n > s.maxReply {
				return nil, s.tooLarge("this delete's prev_kv", n, "delete without prev_kv, or in smaller ranges")
			}
			if err := s.holdReply(ctx, n); err != nil {
				return nil, err
			}
		}
		w.Ops = w.Ops[:0]
		for _, kv := range snap.Items {
			w.Ops = append(w.Ops, store.Op{Type: store.OpDelete, Key: kv.Key})
		}
	}
	res, err := s.node.Write(ctx, sp.room, w, c.claims, c.addr)
	if err != nil {
		return nil, grpcError(err)
	}
	return deleteResponse(s.Server, sp.pre, res.Rev, res.Events, r.PrevKv), nil
}

func deleteResponse(s *Server, pre string, rev uint64, evs []store.Event, prevKV bool) *pb.DeleteRangeResponse {
	resp := &pb.DeleteRangeResponse{Header: s.header(rev)}
	for _, ev := range evs {
		if ev.Type != store.OpDelete {
			continue
		}
		resp.Deleted++
		if prevKV && ev.Prev != nil {
			resp.PrevKvs = append(resp.PrevKvs, toKV(pre, *ev.Prev, false))
		}
	}
	return resp
}

// Compact compacts one room's history on this node (rooms.Engine.Compact):
// etcd's request names no key, so the room comes as gRPC metadata
// statecast-room, else it is the default room.
func (s kvServer) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	md, _ := metadata.FromIncomingContext(ctx)
	room := md.Get("statecast-room")
	if len(room) == 0 && s.defaultRoom != "" {
		room = []string{s.defaultRoom} // etcd's keyspace
	}
	if len(room) != 1 {
		return nil, status.Error(codes.InvalidArgument, "statecast: revisions are per room: name the room to compact in gRPC metadata statecast-room (or serve with --etcd-default-room)")
	}
	if err := store.ValidClientRoom(room[0]); err != nil { // not the server's own rooms
		return nil, status.Error(codes.InvalidArgument, "statecast: "+err.Error())
	}
	// Compaction drops what clients can replay: it takes the right to
	// write the whole room.
	if !c.claims.CanWrite(room[0], "") {
		return nil, status.Error(codes.PermissionDenied, "statecast: compacting a room takes a token that may write all of it")
	}
	if r.Revision <= 1 { // etcd's revision 1 is the empty room: nothing before it
		return nil, status.Error(codes.InvalidArgument, "statecast: compact to a revision of at least 2")
	}
	head, err := s.node.Compact(ctx, room[0], roomRev(r.Revision), c.claims, c.addr)
	if err != nil {
		return nil, grpcError(err)
	}
	return &pb.CompactionResponse{Header: s.header(head)}, nil
}

// txnAttempts bounds how often a Txn is evaluated again when a key it
// read changed before it committed.
const txnAttempts = 20

// Txn is optimistic: it reads the keys it compares and touches at one
// revision, evaluates the compares and runs the chosen branch against
// that state, then commits the branch's writes conditional on the
// mod_rev of every key it read (the store checks those atomically with
// the commit, on every store). A key changed meanwhile fails the
// condition and the Txn is evaluated again on the new state: the outcome
// is the one the compares give at the commit's revision, as in etcd.
// A range in the branch reads the state the txn committed on: when other
// writes came between the read and the commit, the branch is evaluated
// again on the state just before the commit (the compares and writes
// were guarded; only what the ranges find may differ), so that a key
// created in a range meanwhile is seen, as etcd's lock recipe needs.
func (s kvServer) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	if len(r.Compare)+len(r.Success)+len(r.Failure) == 0 {
		return &pb.TxnResponse{Header: s.header(0), Succeeded: true}, nil // etcd: nothing to do succeeds
	}
	t, err := s.parseTxn(r)
	if err != nil {
		return nil, err
	}
	for _, sp := range t.spans {
		if err := sp.canRead(c); err != nil {
			return nil, err
		}
	}
	past := func(sp span, rev int64) ([]store.KV, error) {
		snap, err := s.read(ctx, sp, rev, rooms.ReadOptions{})
		return snap.Items, err
	}
	ranges := t.keyRanges()
	for attempt := 0; attempt < txnAttempts; attempt++ {
		snap, err := s.engine.ListRanges(ctx, t.room, ranges, rooms.ReadOptions{})
		if err != nil {
			return nil, grpcError(err)
		}
		run, err := t.run(s.Server, snap, past)
		if err != nil {
			return nil, err
		}
		// Its reply was bounded before anything was gathered (run); it
		// is held before anything is written.
		if err := s.holdReply(ctx, run.bytes); err != nil {
			return nil, err
		}
		if len(run.write.Ops) == 0 { // nothing to write: answered at the read's revision
			return run.response(s.Server, snap.Rev, nil), nil
		}
		if limit := s.limits.WithDefaults().MaxOps; len(run.write.Ops)+len(run.write.Conds) > limit {
			return nil, status.Errorf(codes.InvalidArgument,
				"statecast: this txn would write %d keys on %d conditions in one write, more than the %d ops and conditions a write may hold: serve with a larger --max-ops",
				len(run.write.Ops), len(run.write.Conds), limit)
		}
		res, err := s.node.Write(ctx, t.room, run.write, c.claims, c.addr)
		var pe *server.Error
		switch {
		case errors.As(err, &pe) && pe.Code == wire.CodeConflict:
			s.dropReply(ctx)
			continue
		case err != nil:
			return nil, grpcError(err)
		}
		if res.Rev > snap.Rev+1 && run.ranges() {
			if err := s.rangeBeforeCommit(ctx, t, run, res.Rev, past); err != nil {
				return nil, err
			}
		}
		return run.response(s.Server, res.Rev, res.Events), nil
	}
	return nil, status.Error(codes.Unavailable, "statecast: the keys of this txn kept changing before it could commit; retry")
}

// rangeBeforeCommit answers run's ranges from the state just before its
// commit at rev, the writes of others that came after run's read
// included.
func (s kvServer) rangeBeforeCommit(ctx context.Context, t *txn, run *txnRun, rev uint64, past pastRead) error {
	// A walk from the txn's first key to its last, keeping only its own:
	// the state before the commit, without copying the keys between.
	o := rooms.PageOptions{Rev: rev - 1, Keep: func(kv store.KV) bool { return t.reads(kv.Key) }}
	o.From, o.To = t.walkBounds()
	page, err := s.engine.ListPage(ctx, t.room, t.cover().prefix(), o, rooms.ReadOptions{})
	if err != nil {
		return grpcError(err)
	}
	again, err := t.run(s.Server, page.Snapshot, past)
	if err != nil {
		return err
	}
	if again.succeeded != run.succeeded || len(again.results) != len(run.results) {
		// The commit's conditions held the compares' keys: it cannot be.
		return status.Error(codes.Internal, "statecast: a txn's compares changed under its commit")
	}
	for i, res := range again.results {
		if res.req.GetRequestRange() != nil {
			run.results[i].items = res.items
		}
	}
	return nil
}
