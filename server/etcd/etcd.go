// Package etcd serves etcd's v3 gRPC API over rooms, so that etcdctl and
// the official etcd clients of every language read, write, lease and
// watch rooms with no statecast SDK (statecast serve --etcd-addr).
//
// An etcd key is /<room>/<key>: one request stays in one room, whose
// revision is the header's (plus one: etcd's revision 1 is the empty
// store). Everything goes through the node
// (*server.Server) as the WebSocket and HTTP surfaces do: the same token
// rules, the one write path, the same TTL leases. The protobuf types are
// etcd's own (go.etcd.io/etcd/api/v3). What still differs from etcd is in
// docs/ETCD.md.
//
//   - etcd.go: the server, auth, keys, values, errors
//   - kv.go: Range (past revisions too), Put, DeleteRange, Txn, Compact
//   - txn.go: a Txn's compares and branches, evaluated on one revision
//   - watch.go: Watch
//   - lease.go: Lease and Maintenance, and the streams' loop
package etcd

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// Config configures a Server.
type Config struct {
	Node *server.Server // required: the node whose rooms are served
	// Name names the node; the headers' member id is derived from it.
	Name string
	// MaxWatches bounds the watches of one Watch stream, and the streams
	// of one connection; default 256 (the node's subscriptions per
	// WebSocket).
	MaxWatches int
	// MaxReplyBytes bounds the keys and values of one reply (a Range, a
	// Txn's ranges and previous values together, a DeleteRange's previous
	// values); default 16 MiB. The replies being built and sent at once
	// hold at most 16 times it over the whole server.
	MaxReplyBytes int
	// MaxWatchBytes bounds the events a connection's watches have taken
	// from their rooms and not yet sent, over all its streams; default
	// 4 MiB. A watch waits for room as etcd's unsynced watchers do, and
	// then catches up from the room's history.
	MaxWatchBytes int
	// IdleTimeout closes a connection that has had no request in flight
	// for that long (an open watch stream is one); default 2 minutes. A
	// connection that has not sent gRPC's preface after 10 s (or
	// IdleTimeout if shorter) is closed.
	IdleTimeout time.Duration
	// DefaultRoom, when set, is the room of the keys that name no other
	// room (any key not /<room>/…, and /<DefaultRoom>/…): its keys are
	// those etcd keys as they are, so an etcd client that knows nothing
	// of rooms has etcd's one keyspace, and a Compact naming no room
	// compacts it. It must be a valid room name (store.ValidClientRoom).
	DefaultRoom string
	// ProgressInterval is how often a watch created with progress_notify
	// that has sent nothing meanwhile is told the revision it stands at,
	// an idle room's included; default 10 minutes, as etcd's.
	ProgressInterval time.Duration
	Logger           *slog.Logger
}

// Server serves the etcd v3 API of one node.
type Server struct {
	node   *server.Server
	engine *rooms.Engine
	limits store.Limits
	log    *slog.Logger
	// defaultRoom holds the keys that name no room (Config.DefaultRoom).
	defaultRoom string
	member      uint64
	maxW        int
	// maxReply bounds one reply; replies holds the bytes of the replies
	// being built and sent, released once each is sent (rpcTagger).
	maxReply  int64
	replies   *semaphore.Weighted
	replyWait time.Duration
	maxWatchQ int64
	progress  time.Duration // Config.ProgressInterval
	grpc      *grpc.Server
	quit      chan struct{} // closed by Stop: watch and keep-alive streams end
	stopped   sync.Once
	streams   sync.WaitGroup
}

// New returns a Server; Serve starts it.
func New(cfg Config) *Server {
	h := fnv.New64a()
	h.Write([]byte(cfg.Name))
	s := &Server{node: cfg.Node, engine: cfg.Node.Engine(), limits: cfg.Node.Limits(), log: cfg.Logger,
		member: h.Sum64(), maxW: cfg.MaxWatches, defaultRoom: cfg.DefaultRoom, quit: make(chan struct{})}
	if s.maxW <= 0 {
		s.maxW = 256
	}
	s.maxReply, s.maxWatchQ = int64(cfg.MaxReplyBytes), int64(cfg.MaxWatchBytes)
	if s.maxReply <= 0 {
		s.maxReply = 16 << 20
	}
	if s.maxWatchQ <= 0 {
		s.maxWatchQ = 4 << 20
	}
	if s.progress = cfg.ProgressInterval; s.progress <= 0 {
		s.progress = 10 * time.Minute
	}
	s.replies, s.replyWait = semaphore.NewWeighted(16*s.maxReply), replyWait
	idle := cfg.IdleTimeout
	if idle <= 0 {
		idle = 2 * time.Minute
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	// etcd's clients ping idle connections; a server that refused their
	// pings would close them (too_many_pings). A connection with no RPC
	// for idle is sent GOAWAY (clients reconnect when they next need it),
	// one that does not answer the server's pings is closed, and one that
	// never speaks gRPC is closed at ConnectionTimeout: otherwise each
	// holds a connection slot and its buffers for good.
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(2 << 20),
		// A request's headers as the HTTP API bounds them: gRPC's default
		// (16 MiB) let one connection's streams hold gigabytes of
		// metadata. etcd's clients send a token and a few short keys.
		grpc.MaxHeaderListSize(maxHeaderBytes),
		grpc.ForceServerCodecV2(newCodec()),
		grpc.MaxConcurrentStreams(uint32(s.maxW)),
		grpc.StatsHandler(rpcTagger{s}),
		grpc.ConnectionTimeout(min(10*time.Second, idle)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle, Time: idle, Timeout: 20 * time.Second}),
	}
	if tp := cfg.Node.TracerProvider(); tp != nil {
		// A span per RPC (a stream's lasts as long as it), continuing the
		// client's traceparent; the node's write path adds its children.
		opts = append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp),
			otelgrpc.WithPropagators(propagation.TraceContext{}), otelgrpc.WithMeterProvider(noop.NewMeterProvider()))))
	}
	s.grpc = grpc.NewServer(opts...)
	pb.RegisterKVServer(s.grpc, kvServer{Server: s})
	pb.RegisterWatchServer(s.grpc, watchServer{Server: s})
	pb.RegisterLeaseServer(s.grpc, leaseServer{Server: s})
	pb.RegisterMaintenanceServer(s.grpc, maintenanceServer{Server: s})
	pb.RegisterAuthServer(s.grpc, authServer{Server: s})
	return s
}

// Serve serves ln until Stop, under the node's connection limits.
func (s *Server) Serve(ln net.Listener) error { return s.grpc.Serve(s.node.GRPCListener(ln)) }

// Stop ends the watch and keep-alive streams (their clients reconnect,
// elsewhere if they know other endpoints), lets the requests in flight
// finish, and closes every connection; when ctx ends first it closes
// them at once (a stream blocked on a client that does not read ends
// with its connection).
func (s *Server) Stop(ctx context.Context) {
	s.stopped.Do(func() { close(s.quit) })
	done := make(chan struct{})
	go func() {
		s.streams.Wait()
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// stream registers a long-lived stream; false when the server is stopping.
// The caller runs s.streams.Done when it ends.
func (s *Server) stream() bool {
	select {
	case <-s.quit:
		return false
	default:
	}
	s.streams.Add(1)
	return true
}

var errStopping = status.Error(codes.Unavailable, "statecast: the node is shutting down; reconnect")

// caller is who sent a request: its claims and its address (the write
// rate of an anonymous client is per address).
type caller struct {
	claims *auth.Claims
	addr   string
}

// caller authenticates a request: a JWT as "authorization: Bearer …",
// or as "token" (what etcd clients send after Authenticate, authServer).
func (s *Server) caller(ctx context.Context) (caller, error) {
	var c caller
	if cs, ok := ctx.Value(connKey{}).(*connState); ok && cs.addr != "" {
		c.addr = cs.addr
	} else if p, ok := peer.FromContext(ctx); ok {
		c.addr = p.Addr.String()
	}
	// The two keys alone: FromIncomingContext would copy every header.
	token := ""
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		if scheme, t, ok := strings.Cut(v[0], " "); ok && strings.EqualFold(scheme, "Bearer") {
			token = strings.TrimSpace(t)
		}
	} else if v := metadata.ValueFromIncomingContext(ctx, rpctypes.TokenFieldNameGRPC); len(v) > 0 {
		token = v[0]
	}
	claims, err := s.node.Identify(ctx, token, c.addr)
	if err != nil {
		return c, authError(err)
	}
	c.claims = claims
	return c, nil
}

func authError(err error) error {
	switch {
	case errors.Is(err, hooks.ErrUnavailable):
		return status.Error(codes.Unavailable, "statecast: the application's connect hook did not answer; retry")
	case errors.Is(err, auth.ErrTokenMissing):
		return status.Error(codes.Unauthenticated, "statecast: a token is required: gRPC metadata authorization: Bearer <JWT>")
	case errors.Is(err, auth.ErrTokenExpired):
		return status.Error(codes.Unauthenticated, "statecast: token expired")
	}
	return status.Error(codes.Unauthenticated, "statecast: invalid token: "+err.Error())
}

// header answers at room revision rev (0 for a request that reads no
// room: the empty room's).
func (s *Server) header(rev uint64) *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: s.member, MemberId: s.member, Revision: etcdRev(rev), RaftTerm: 1}
}

// Revisions. A room's first write is its revision 1; etcd's first write
// is revision 2, revision 1 being the empty store, and its clients count
// on it (an election's waitDeletes reads "created before my key" as
// max_create_revision = my revision - 1, where 0 means no bound). So the
// etcd view of a room is one revision ahead of the room's own: the etcd
// revision of room revision r is r+1, everywhere a revision goes in or
// out of this API. WebSocket and HTTP clients see the room's own.

// etcdRev is the etcd revision of room revision r (0: the empty room, 1).
func etcdRev(r uint64) int64 { return int64(r) + 1 }

// keyRev is the etcd revision of a key's create or mod revision r; 0 (no
// such key) stays 0, as etcd shows a missing key.
func keyRev(r uint64) int64 {
	if r == 0 {
		return 0
	}
	return int64(r) + 1
}

// roomRev is the room revision of etcd revision r ≥ 1.
func roomRev(r int64) uint64 { return uint64(r - 1) }

// span is what a request's key and range_end select inside one room: its
// keys from lo, up to hi (excluded) unless open, or exactly lo when single.
// lo and hi are store keys (storeKey); pre is what names the room before
// each key in etcd's keyspace: "/<room>/", or nothing in the default room.
type span struct {
	room, pre, lo, hi string
	single, open      bool
}

// spanErr says how keys name rooms.
func (s *Server) spanErr(format string, args ...any) error {
	hint := "; serve with --etcd-default-room for etcd's own keyspace"
	if s.defaultRoom != "" {
		hint = "; the keys that name no room are room " + s.defaultRoom + "'s"
	}
	return status.Error(codes.InvalidArgument, "statecast: "+fmt.Sprintf(format, args...)+
		": an etcd key is /<room>/<key> and a request stays in one room (a prefix: /<room>/ or /<room>/<key prefix>)"+hint)
}

// parseSpan reads an etcd key and range_end: in the room the key names
// (/<room>/…), else in the default room, whose keys are the etcd keys
// themselves.
func (s *Server) parseSpan(key, end []byte) (span, error) {
	k := string(key)
	room, rest, ok := strings.Cut(strings.TrimPrefix(k, "/"), "/")
	named := strings.HasPrefix(k, "/") && ok
	if named {
		err := store.ValidClientRoom(room)
		switch {
		case s.defaultRoom != "" && (err != nil || room == s.defaultRoom):
			named = false // a key of the default room
		case err != nil:
			return span{}, status.Error(codes.InvalidArgument, "statecast: "+err.Error())
		}
	}
	if !named {
		if s.defaultRoom == "" {
			if len(end) > 0 {
				return span{}, s.spanErr("the range [%q, %q) spans rooms", key, end)
			}
			return span{}, s.spanErr("key %q names no room", key)
		}
		room, rest = s.defaultRoom, k
	}
	sp := span{room: room, pre: s.prefixOf(room), lo: storeKey(rest)}
	switch e := string(end); {
	case e == "":
		sp.single = true
		return sp, nil
	case !named && e == "\x00", named && e == prefixEnd(sp.pre):
		sp.open = true
	case strings.HasPrefix(e, sp.pre) && named:
		sp.hi = storeBound(rest, e[len(sp.pre):])
	case !named:
		sp.hi = storeBound(rest, e)
	default:
		return span{}, s.spanErr("the range [%q, %q) spans rooms", key, end)
	}
	if rest == "\x00" {
		sp.lo = "" // etcd's first key (clientv3's from-key and prefix of "")
	}
	return sp, nil
}

// prefixOf is what names room before its keys in etcd's keyspace
// (span.pre).
func (s *Server) prefixOf(room string) string {
	if room == s.defaultRoom {
		return ""
	}
	return "/" + room + "/"
}

// Keys. A store key is UTF-8 text with no NUL; etcd's are bytes. A key
// that is not such text is stored as its text up to the first byte that
// is not (a NUL, a byte that is not UTF-8, or U+10FFFF itself), then
// U+10FFFF, then the rest of it in lowercase hex: byte-exact back
// through etcd, and readable by the JSON clients. Such keys sort after
// the text keys with the same text before them, not in etcd's byte
// order.
const binaryMark = "\U0010FFFF"

// storeKey is the store key of etcd key k.
func storeKey(k string) string { return storeKeyFrom(k, binaryAt(k)) }

// binaryAt is where k stops being text a store key can hold: len(k) if
// it never does.
func binaryAt(k string) int {
	for i := 0; i < len(k); {
		r, n := utf8.DecodeRuneInString(k[i:])
		if r == 0 || r == utf8.MaxRune || r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(k)
}

// storeKeyFrom is k with its bytes from i in hex.
func storeKeyFrom(k string, i int) string {
	if i >= len(k) {
		return k
	}
	return k[:i] + binaryMark + hex.EncodeToString([]byte(k[i:]))
}

// storeBound is the store key of the end of a range from etcd key lo:
// where both have the text before lo's bytes, the end's rest is in hex
// too, so that lo and the end compare as the keys between them do
// (["a\x00", "a\x01") holds "a\x00\x05").
func storeBound(lo, end string) string {
	i := binaryAt(lo)
	if i < len(lo) && i <= len(end) && end[:i] == lo[:i] && i <= binaryAt(end) {
		return storeKeyFrom(end, i)
	}
	return storeKey(end)
}

// etcdKey is the etcd key of store key k: k itself unless it is
// storeKey's form of other bytes (a JSON client may write a key with
// U+10FFFF that is not).
func etcdKey(k string) string {
	i := strings.Index(k, binaryMark)
	if i < 0 {
		return k
	}
	b, err := hex.DecodeString(k[i+len(binaryMark):])
	if err != nil {
		return k
	}
	if e := k[:i] + string(b); storeKey(e) == k {
		return e
	}
	return k
}

// prefixEnd is etcd's range end of a prefix: the least key above every
// key that starts with p.
func prefixEnd(p string) string {
	b := []byte(p)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return "\x00"
}

// prefix is the longest key prefix that covers the span: what is listed
// or watched, and what the token must allow reading.
func (sp span) prefix() string {
	switch {
	case sp.single:
		return sp.lo
	case sp.open:
		return ""
	case sp.hi == prefixEnd(sp.lo):
		return sp.lo
	}
	n := 0
	for n < len(sp.lo) && n < len(sp.hi) && sp.lo[n] == sp.hi[n] {
		n++
	}
	return sp.lo[:n]
}

// walkBounds is sp as a page's From and To: a walk of the range, not of
// every key under the prefix its ends share. An empty range walks at most
// its one start key, which has does not hold.
func (sp span) walkBounds() (from, to string) {
	switch {
	case sp.open:
		return sp.lo, ""
	case sp.single || sp.hi <= sp.lo:
		return sp.lo, sp.lo + "\x00"
	}
	return sp.lo, sp.hi
}

func (sp span) has(k string) bool {
	if sp.single {
		return k == sp.lo
	}
	return k >= sp.lo && (sp.open || k < sp.hi)
}

func (sp span) canRead(c caller) error {
	if !c.claims.CanRead(sp.room, sp.prefix()) {
		return status.Error(codes.PermissionDenied, fmt.Sprintf("statecast: the token does not allow reading %q in room %q", sp.prefix(), sp.room))
	}
	return nil
}

// Values. A room's values are JSON (the WebSocket and HTTP clients read
// them as such); etcd's are bytes. A JSON string is its text, any other
// JSON value is its JSON text: so bytes that are canonical JSON other
// than a string are stored as that JSON, other UTF-8 text as a JSON
// string, and bytes that are not UTF-8 as {"$bytes":"<base64>"}; each
// reads back as the bytes written. A WebSocket client writing "hello"
// and an etcd client writing hello store the same value, and one writing
// {"$bytes":"AAE="} stores the bytes 0x00 0x01 for etcd clients. etcd
// text that is itself that form is stored as a JSON string, so that it
// reads back as the text.

const bytesTag, bytesEnd = `{"$bytes":"`, `"}`

// toValue turns etcd bytes into a room's value.
func toValue(b []byte) ([]byte, error) {
	if len(b) > 0 && mayBeJSON(b[0]) && !isTagged(b) {
		if v, err := wire.ValueFromJSON(b); err == nil && bytes.Equal(v, b) {
			return v, nil
		}
	}
	if plainText(b) {
		// What json.Marshal would make of it, without its passes over b
		// (the common etcd value: printable text, not JSON).
		v := make([]byte, 0, len(b)+2)
		return append(append(append(v, '"'), b...), '"'), nil
	}
	if !utf8.Valid(b) {
		v := make([]byte, 0, len(bytesTag)+base64.StdEncoding.EncodedLen(len(b))+len(bytesEnd))
		v = append(base64.StdEncoding.AppendEncode(append(v, bytesTag...), b), bytesEnd...)
		return v, nil
	}
	s, _ := json.Marshal(string(b))
	v, err := wire.ValueFromJSON(s)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "statecast: "+err.Error())
	}
	return v, nil
}

// mayBeJSON says whether a value starting with c may be JSON text other
// than a string (which toValue stores as the text it is).
func mayBeJSON(c byte) bool {
	return c == '{' || c == '[' || c == '-' || c >= '0' && c <= '9' || c == 't' || c == 'f' || c == 'n'
}

// plainText says whether b is printable ASCII that a JSON string holds
// as is: no quote, backslash or control character.
func plainText(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// isTagged says whether v is {"$bytes":"<base64>"}, as this API writes
// bytes that are not UTF-8 (and accepts from JSON clients).
func isTagged(v []byte) bool {
	_, ok := untag(v)
	return ok
}

func untag(v []byte) ([]byte, bool) {
	b64, ok := bytes.CutPrefix(v, []byte(bytesTag))
	if !ok {
		return nil, false
	}
	if b64, ok = bytes.CutSuffix(b64, []byte(bytesEnd)); !ok {
		return nil, false
	}
	b, err := base64.StdEncoding.AppendDecode(nil, b64)
	return b, err == nil
}

// fromValue turns a room's value into etcd bytes. A string with no
// escapes is its own text: the store's slice is shared, not copied (a
// value goes to every watch and every range that reads it).
func fromValue(v []byte) []byte {
	if len(v) >= 2 && v[0] == '"' && bytes.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1 : len(v)-1]
	}
	if len(v) > 0 && v[0] == '"' {
		var s string
		if json.Unmarshal(v, &s) == nil {
			return []byte(s)
		}
	}
	if b, ok := untag(v); ok {
		return b
	}
	return v
}

// Leases. etcd's lease ids are int64s; a statecast TTL lease granted
// through this API is named ttl_etcd_<16 hex digits> after its etcd id,
// so that any node, on any store, maps one to the other with no table.
// Leases granted over HTTP (ttl_<random>) and session leases have no etcd
// id: their keys show lease 0.
const leasePrefix = "ttl_etcd_"

func leaseName(id int64) string { return fmt.Sprintf("%s%016x", leasePrefix, uint64(id)) }

func leaseNum(name string) int64 {
	hex, ok := strings.CutPrefix(server.LocalLease(name), leasePrefix)
	if !ok {
		return 0
	}
	n, _ := strconv.ParseUint(hex, 16, 64)
	return int64(n)
}

// toKV is kv as etcd's, in the span whose keys pre names (span.pre).
func toKV(pre string, kv store.KV, keysOnly bool) *mvccpb.KeyValue {
	out := &mvccpb.KeyValue{Key: []byte(pre + etcdKey(kv.Key)), CreateRevision: keyRev(kv.CreateRev),
		ModRevision: keyRev(kv.ModRev), Version: int64(kv.Version), Lease: leaseNum(kv.Lease)}
	if !keysOnly {
		out.Value = fromValue(kv.Value)
	}
	return out
}

// grpcCodes are the gRPC codes of the node's error codes (server.Error).
var grpcCodes = map[string]codes.Code{
	wire.CodeForbidden:      codes.PermissionDenied,
	wire.CodeUnauthorized:   codes.Unauthenticated,
	wire.CodeRateLimited:    codes.ResourceExhausted,
	wire.CodeUnavailable:    codes.Unavailable,
	wire.CodeOutcomeUnknown: codes.Unknown,
	wire.CodeConflict:       codes.Aborted,
	wire.CodeInternal:       codes.Internal,
}

// grpcError maps an error of the node, the engine or the store to a gRPC
// status, with etcd's own message where clients look for it.
func grpcError(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	var pe *server.Error
	if errors.As(err, &pe) {
		switch pe.Code {
		case wire.CodeNotFound:
			if pe.Key != "" { // a put with ignore_lease or ignore_value
				return rpctypes.ErrGRPCKeyNotFound
			}
			return rpctypes.ErrGRPCLeaseNotFound // the only other thing these requests do not find
		case wire.CodeQuotaExceeded:
			return rpctypes.ErrGRPCNoSpace // a room over its quota, as etcd over its own
		}
		code, ok := grpcCodes[pe.Code]
		if !ok {
			code = codes.InvalidArgument // the invalid_* codes, bad_request, too_large
		}
		return status.Error(code, "statecast: "+pe.Message)
	}
	var ce *store.CompactedError
	switch {
	case errors.As(err, &ce), errors.Is(err, rooms.ErrEpochMismatch):
		return rpctypes.ErrGRPCCompacted
	case errors.Is(err, rooms.ErrFutureRevision):
		return rpctypes.ErrGRPCFutureRev
	case errors.Is(err, store.ErrInvalidRoom), errors.Is(err, store.ErrInvalidKey):
		return status.Error(codes.InvalidArgument, "statecast: "+err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "statecast: canceled")
	case errors.Is(err, rooms.ErrClosed), errors.Is(err, store.ErrClosed):
		return errStopping
	case errors.Is(err, rooms.ErrUnsynced), errors.Is(err, rooms.ErrRoomReset), errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.Unavailable, "statecast: the room is unavailable on this node; retry")
	}
	return status.Error(codes.Internal, "statecast: internal error")
}

// authServer answers Authenticate only, so that a client configured with
// a user name and password (etcdctl --user name:<JWT>) sends the JWT: the
// password is the token, the name is not looked at. The rest of etcd's
// auth API (users, roles) does not exist here: grants are in the tokens.
type authServer struct {
	pb.UnimplementedAuthServer
	*Server
}

func (a authServer) Authenticate(ctx context.Context, r *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	addr := ""
	if p, ok := peer.FromContext(ctx); ok {
		addr = p.Addr.String()
	}
	if _, err := a.node.Identify(ctx, r.Password, addr); err != nil {
		return nil, rpctypes.ErrGRPCAuthFailed
	}
	return &pb.AuthenticateResponse{Header: a.header(0), Token: r.Password}, nil
}

// maxHeaderBytes bounds a request's header list (its metadata).
const maxHeaderBytes = 64 << 10

// rpcTagger gives each connection a count of its watches, over all its
// Watch streams (a stream's context carries its connection's values), so
// a connection holds MaxWatches watches, as a WebSocket holds
// --max-subscriptions, however many streams it opens; and the budget of
// the events its watches hold unsent (MaxWatchBytes). Each RPC gets a
// replyHold, released when the RPC has sent its reply.
type rpcTagger struct{ s *Server }

type connKey struct{}

type rpcKey struct{}

// connState is what the watches of one connection share.
type connState struct {
	addr    string // the client's address, formatted once a connection
	watches atomic.Int64
	queued  *semaphore.Weighted // bytes of events taken and not yet sent
	events  eventCache
}

// replyHold is the bytes of the server's reply budget an RPC holds.
type replyHold struct{ n int64 }

func (t rpcTagger) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	cs := t.s.newConnState()
	if info != nil && info.RemoteAddr != nil {
		cs.addr = info.RemoteAddr.String()
	}
	return context.WithValue(ctx, connKey{}, cs)
}
func (rpcTagger) HandleConn(context.Context, stats.ConnStats) {}
func (rpcTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, rpcKey{}, new(replyHold))
}

// HandleRPC releases the reply's bytes once it is sent (End comes after).
func (t rpcTagger) HandleRPC(ctx context.Context, st stats.RPCStats) {
	if _, ok := st.(*stats.End); !ok {
		return
	}
	if h, ok := ctx.Value(rpcKey{}).(*replyHold); ok && h.n > 0 {
		t.s.replies.Release(h.n)
		h.n = 0
	}
}

func (s *Server) newConnState() *connState {
	return &connState{queued: semaphore.NewWeighted(s.maxWatchQ)}
}

// connOf is the state of ctx's connection.
func (s *Server) connOf(ctx context.Context) *connState {
	if c, ok := ctx.Value(connKey{}).(*connState); ok {
		return c
	}
	return s.newConnState() // not served by this server's grpc: its own
}
