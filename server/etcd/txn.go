package etcd

import (
	"bytes"
	"cmp"
	"slices"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// txn is a parsed TxnRequest: every key of it in one room.
type txn struct {
	room, pre        string // pre: span.pre
	spans            []span // of every compare and op: what the txn reads
	compares         []span // compares[i] is r.Compare[i]'s
	req              *pb.TxnRequest
	success, failure []txnOp
}

type txnOp struct {
	sp  span
	req *pb.RequestOp
	put store.Op // a put's
}

// maxTxnOps bounds a txn's compares and ops, each a read of the room
// (etcd's --max-txn-ops default).
const maxTxnOps = 128

func (s *Server) parseTxn(r *pb.TxnRequest) (*txn, error) {
	if len(r.Compare)+len(r.Success)+len(r.Failure) > maxTxnOps {
		return nil, rpctypes.ErrGRPCTooManyOps
	}
	t := &txn{req: r}
	add := func(sp span) error {
		if t.room == "" {
			t.room, t.pre = sp.room, sp.pre
		} else if sp.room != t.room {
			return s.spanErr("a txn spans rooms %q and %q", t.room, sp.room)
		}
		t.spans = append(t.spans, sp)
		return nil
	}
	for _, c := range r.Compare {
		sp, err := s.parseSpan(c.Key, c.RangeEnd)
		if err == nil && !sp.single {
			// The commit is conditional on the mod_rev of each key read: a
			// key appearing in a range meanwhile could not be guarded, and
			// "the prefix is empty" would hold for two txns at once.
			err = status.Error(codes.InvalidArgument, "statecast: a compare over a range is not supported: compare keys one by one")
		}
		if err == nil {
			err = add(sp)
		}
		if err != nil {
			return nil, err
		}
		t.compares = append(t.compares, sp)
	}
	ops := func(reqs []*pb.RequestOp) ([]txnOp, error) {
		out := make([]txnOp, 0, len(reqs))
		for _, req := range reqs {
			op := txnOp{req: req}
			var err error
			switch {
			case req.GetRequestRange() != nil:
				rr := req.GetRequestRange()
				op.sp, err = s.parseSpan(rr.Key, rr.RangeEnd)
			case req.GetRequestPut() != nil:
				op.sp, op.put, err = s.putOp(req.GetRequestPut())
			case req.GetRequestDeleteRange() != nil:
				dr := req.GetRequestDeleteRange()
				op.sp, err = s.parseSpan(dr.Key, dr.RangeEnd)
			case req.GetRequestTxn() != nil:
				return nil, status.Error(codes.InvalidArgument, "statecast: a txn inside a txn is not supported")
			default:
				return nil, status.Error(codes.InvalidArgument, "statecast: a txn op with no request")
			}
			if err == nil {
				err = add(op.sp)
			}
			if err != nil {
				return nil, err
			}
			out = append(out, op)
		}
		return out, nil
	}
	var err error
	if t.success, err = ops(r.Success); err != nil {
		return nil, err
	}
	if t.failure, err = ops(r.Failure); err != nil {
		return nil, err
	}
	if t.room == "" {
		return nil, status.Error(codes.InvalidArgument, "statecast: an empty txn names no room")
	}
	return t, nil
}

// cover is the one prefix of the room that holds every key of the txn.
func (t *txn) cover() span {
	p := t.spans[0].prefix()
	for _, sp := range t.spans[1:] {
		q := sp.prefix()
		n := 0
		for n < len(p) && n < len(q) && p[n] == q[n] {
			n++
		}
		p = p[:n]
	}
	if p == "" {
		return span{room: t.room, open: true}
	}
	return span{room: t.room, lo: p, hi: prefixEnd(p)}
}

// keyRanges is what t reads: each span, not the one prefix they share
// (two keys far apart share none, and reading that is reading the room).
func (t *txn) keyRanges() []rooms.KeyRange {
	rs := make([]rooms.KeyRange, len(t.spans))
	for i, sp := range t.spans {
		rs[i].Lo, rs[i].Hi = sp.walkBounds()
	}
	return rs
}

// walkBounds is the range from t's first key to past its last, as a
// page's From and To.
func (t *txn) walkBounds() (from, to string) {
	for i, sp := range t.spans {
		lo, hi := sp.walkBounds()
		if i == 0 || lo < from {
			from = lo
		}
		if i == 0 || to != "" && (hi == "" || hi > to) {
			to = hi
		}
	}
	return from, to
}

// reads says whether one of t's spans holds k.
func (t *txn) reads(k string) bool {
	for _, sp := range t.spans {
		if sp.has(k) {
			return true
		}
	}
	return false
}

// txnRun is one evaluation of a txn on the state at one revision: the
// branch taken, the write it makes and what its ops answer.
type txnRun struct {
	room, pre string
	succeeded bool
	write     store.Write
	results   []opResult
	bytes     int64 // the most its response can take (replies.go)
}

// opResult is an op's answer before the commit: a range's keys (those
// the txn itself wrote have ModRev 0 until the commit's events fill
// them in), a put's or delete's previous keys.
type opResult struct {
	req   *pb.RequestOp
	items []store.KV
	prev  []store.KV
}

// pastRead reads a span at an etcd revision before the txn's (a range
// naming one: concurrency.STM reads every key at its first read's).
type pastRead func(sp span, rev int64) ([]store.KV, error)

// run evaluates t on snap, whose items are sorted by key. A range reads
// them in place (a part of snap.Items, shared) unless the txn wrote in
// it before: only then are its keys gathered.
func (t *txn) run(s *Server, snap store.Snapshot, past pastRead) (*txnRun, error) {
	base := snap.Items
	written := make(map[string]*store.KV) // by the txn so far; nil: deleted
	get := func(k string) (store.KV, bool) {
		if kv, ok := written[k]; ok {
			if kv == nil {
				return store.KV{}, false
			}
			return *kv, true
		}
		i, ok := slices.BinarySearchFunc(base, k, func(kv store.KV, k string) int { return strings.Compare(kv.Key, k) })
		if !ok {
			return store.KV{}, false
		}
		return base[i], true
	}
	// inBase is sp's keys in snap, without the txn's writes.
	inBase := func(sp span) []store.KV {
		lo, _ := slices.BinarySearchFunc(base, sp.lo, func(kv store.KV, k string) int { return strings.Compare(kv.Key, k) })
		hi := len(base)
		switch {
		case sp.single:
			hi = lo
			if lo < len(base) && base[lo].Key == sp.lo {
				hi = lo + 1
			}
		case !sp.open:
			hi, _ = slices.BinarySearchFunc(base, sp.hi, func(kv store.KV, k string) int { return strings.Compare(kv.Key, k) })
			hi = max(hi, lo)
		}
		return base[lo:hi:hi]
	}
	in := func(sp span) []store.KV {
		if sp.single {
			if kv, ok := get(sp.lo); ok {
				return []store.KV{kv}
			}
			return nil
		}
		kvs := inBase(sp)
		mine := 0
		for k := range written {
			if sp.has(k) {
				mine++
			}
		}
		if mine == 0 {
			return kvs
		}
		out := make([]store.KV, 0, len(kvs)+mine)
		for _, kv := range kvs {
			if _, ok := written[kv.Key]; !ok {
				out = append(out, kv)
			}
		}
		for k, kv := range written {
			if kv != nil && sp.has(k) {
				out = append(out, *kv)
			}
		}
		slices.SortFunc(out, func(a, b store.KV) int { return strings.Compare(a.Key, b.Key) })
		return out
	}
	// ranged is what range op reads: the txn's state so far, or the keys
	// at the revision it names (before the txn's writes, as in etcd). A
	// span read again at the same revision and writes is read once: a txn
	// of 128 ranges of one room at a past revision rebuilt the room 128
	// times, and one after a write gathered it 128 times.
	run := &txnRun{room: t.room, pre: t.pre, succeeded: true}
	type readKey struct {
		sp     span
		rev    int64
		writes int // len(run.write.Ops) when read at the txn's state
	}
	reads := make(map[readKey][]store.KV)
	ranged := func(op txnOp) ([]store.KV, error) {
		rev := op.req.GetRequestRange().Revision
		k := readKey{sp: op.sp, rev: max(rev, 0), writes: -1}
		if rev <= 0 {
			k.writes = len(run.write.Ops)
		}
		if kvs, ok := reads[k]; ok {
			return kvs, nil
		}
		var kvs []store.KV
		var err error
		switch {
		case rev <= 0:
			kvs = in(op.sp)
		case roomRev(rev) == snap.Rev:
			kvs = inBase(op.sp)
		case roomRev(rev) > snap.Rev:
			return nil, rpctypes.ErrGRPCFutureRev
		default:
			if kvs, err = past(op.sp, rev); err != nil {
				return nil, err
			}
		}
		reads[k] = kvs
		return kvs, nil
	}
	guards := make(map[string]uint64) // key → mod_rev read (0: absent)
	guard := func(k string) {
		if k == "" {
			return // "/<room>/" names no key: it is never there
		}
		if _, ok := guards[k]; !ok {
			kv, _ := get(k)
			guards[k] = kv.ModRev
		}
	}
	// bound is the most range rr of kvs can reply (its limit's largest
	// keys), from the keys' sizes: counted before any is gathered.
	bound := func(kvs []store.KV, rr *pb.RangeRequest) int64 {
		if rr.CountOnly {
			return 0
		}
		if rr.Limit <= 0 || int64(len(kvs)) <= rr.Limit {
			return kvsBytes(t.room, kvs, rr.KeysOnly)
		}
		sizes := make([]int64, len(kvs))
		for i, kv := range kvs {
			sizes[i] = kvBytes(t.room, kv, rr.KeysOnly)
		}
		return largest(sizes, rr.Limit)
	}
	tooLarge := func() error {
		return s.tooLarge("this txn", run.bytes, "read fewer keys per txn (a Range with a limit pages)")
	}
	for i, c := range t.req.Compare {
		sp := t.compares[i]
		if sp.single {
			guard(sp.lo)
		}
		kvs := in(sp)
		for _, kv := range kvs {
			guard(kv.Key)
		}
		if len(kvs) == 0 { // etcd compares a missing key as an empty one, but never its value
			run.succeeded = run.succeeded && c.Target != pb.Compare_VALUE && holds(c, store.KV{})
		}
		for _, kv := range kvs {
			run.succeeded = run.succeeded && holds(c, kv)
		}
	}
	ops := t.success
	if !run.succeeded {
		ops = t.failure
	}
	write := func(op store.Op) error {
		if _, ok := written[op.Key]; ok {
			return rpctypes.ErrGRPCDuplicateKey
		}
		guard(op.Key)
		written[op.Key] = nil // deleted, or put just below
		run.write.Ops = append(run.write.Ops, op)
		return nil
	}
	for _, op := range ops {
		res := opResult{req: op.req}
		switch {
		case op.req.GetRequestRange() != nil:
			items, err := ranged(op)
			if err != nil {
				return nil, err
			}
			if run.bytes += bound(items, op.req.GetRequestRange()); run.bytes > s.maxReply {
				return nil, tooLarge()
			}
			res.items = items
		case op.req.GetRequestPut() != nil:
			prev, ok := get(op.put.Key)
			if err := write(op.put); err != nil {
				return nil, err
			}
			if ok {
				res.prev = []store.KV{prev}
				if op.req.GetRequestPut().PrevKv {
					run.bytes += kvBytes(t.room, prev, false)
				}
			}
			written[op.put.Key] = &store.KV{Key: op.put.Key, Value: op.put.Value} // filled in from the commit's event
		default:
			for _, kv := range in(op.sp) {
				if err := write(store.Op{Type: store.OpDelete, Key: kv.Key}); err != nil {
					return nil, err
				}
				res.prev = append(res.prev, kv)
			}
			if op.req.GetRequestDeleteRange().PrevKv {
				run.bytes += kvsBytes(t.room, res.prev, false)
			}
		}
		if run.bytes > s.maxReply {
			return nil, tooLarge()
		}
		run.results = append(run.results, res)
	}
	if len(run.write.Ops) > 0 {
		for k, rev := range guards {
			run.write.Conds = append(run.write.Conds, store.Cond{Key: k, ModRev: rev})
		}
		slices.SortFunc(run.write.Conds, func(a, b store.Cond) int { return strings.Compare(a.Key, b.Key) })
	}
	return run, nil
}

// ranges says whether the branch run took has a range.
func (run *txnRun) ranges() bool {
	for _, res := range run.results {
		if res.req.GetRequestRange() != nil {
			return true
		}
	}
	return false
}

// holds evaluates one compare on one key.
func holds(c *pb.Compare, kv store.KV) bool {
	var n int
	switch c.Target {
	case pb.Compare_VERSION:
		n = cmp.Compare(kv.Version, uint64(c.GetVersion()))
	case pb.Compare_CREATE:
		n = cmp.Compare(keyRev(kv.CreateRev), c.GetCreateRevision())
	case pb.Compare_MOD:
		n = cmp.Compare(keyRev(kv.ModRev), c.GetModRevision())
	case pb.Compare_VALUE:
		n = bytes.Compare(fromValue(kv.Value), c.GetValue())
	case pb.Compare_LEASE:
		n = cmp.Compare(uint64(leaseNum(kv.Lease)), uint64(c.GetLease()))
	}
	switch c.Result {
	case pb.Compare_EQUAL:
		return n == 0
	case pb.Compare_GREATER:
		return n > 0
	case pb.Compare_LESS:
		return n < 0
	}
	return n != 0
}

// response answers the txn committed at rev with evs (none: nothing
// written, rev is the read's).
func (run *txnRun) response(s *Server, rev uint64, evs []store.Event) *pb.TxnResponse {
	committed := make(map[string]store.KV, len(evs))
	for _, ev := range evs {
		committed[ev.KV.Key] = ev.KV
	}
	resp := &pb.TxnResponse{Header: s.header(rev), Succeeded: run.succeeded}
	for _, res := range run.results {
		var out *pb.ResponseOp
		switch {
		case res.req.GetRequestRange() != nil:
			for i, kv := range res.items {
				if kv.ModRev == 0 {
					res.items[i] = committed[kv.Key]
				}
			}
			kvs, count, more := rangeKVs(res.items, true, res.req.GetRequestRange())
			rr := s.rangeResponse(run.pre, kvs, count, more, rev, res.req.GetRequestRange())
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
		case res.req.GetRequestPut() != nil:
			pr := &pb.PutResponse{Header: s.header(rev)}
			if res.req.GetRequestPut().PrevKv && len(res.prev) == 1 {
				pr.PrevKv = toKV(run.pre, res.prev[0], false)
			}
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: pr}}
		default:
			dr := &pb.DeleteRangeResponse{Header: s.header(rev), Deleted: int64(len(res.prev))}
			if res.req.GetRequestDeleteRange().PrevKv {
				dr.PrevKvs = make([]*mvccpb.KeyValue, len(res.prev))
				for i, kv := range res.prev {
					dr.PrevKvs[i] = toKV(run.pre, kv, false)
				}
			}
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: dr}}
		}
		resp.Responses = append(resp.Responses, out)
	}
	return resp
}
