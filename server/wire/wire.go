// Package wire defines the statecast protocol (PROTOCOL.md): its messages,
// error codes, close codes and the codecs of versions 1 (JSON, MessagePack)
// and 2 (dense JSON, §11). The server and the Go client both speak it
// through this package. The message structs are version 1's; version 2
// differs only in how its codec writes and reads events and snapshot items.
package wire

import "github.com/coder/websocket"

// Protocol v1 messages (PROTOCOL.md). Field tags are shared by both codecs:
// the msgpack codec reads the json tags.

// Value is a key's value as canonical (compact) JSON text. Codecs convert
// it to and from their own representation.
type Value []byte

// Request is any client → server message; T says which fields apply.
type Request struct {
	T        string    `json:"t"`
	ID       uint64    `json:"id,omitempty"`
	Token    string    `json:"token,omitempty"`
	Session  string    `json:"session,omitempty"`
	Resume   string    `json:"resume,omitempty"`
	Room     string    `json:"room,omitempty"`
	Key      string    `json:"key,omitempty"`
	Value    Value     `json:"value,omitempty"`
	IfRev    *uint64   `json:"if_rev,omitempty"`
	Lease    string    `json:"lease,omitempty"`
	Prefixes []string  `json:"prefixes,omitempty"`
	Keys     []string  `json:"keys,omitempty"` // sub: exact keys, besides prefixes
	From     *Position `json:"from,omitempty"`
	Prev     bool      `json:"prev,omitempty"`
	Filter   string    `json:"filter,omitempty"` // sub: a CEL expression over each key's value
	Sub      uint64    `json:"sub,omitempty"`
	If       []Cond    `json:"if,omitempty"`
	Ops      []TxnOp   `json:"ops,omitempty"`
	// Wid is a write's client write id (PROTOCOL.md §6); Since, with it,
	// a revision the client had seen before it first sent the write.
	Wid   string  `json:"wid,omitempty"`
	Since *uint64 `json:"since,omitempty"`
}

// Position is a subscription's resume point.
type Position struct {
	Epoch string `json:"epoch"`
	Rev   uint64 `json:"rev"`
}

// Cond is a transaction condition.
type Cond struct {
	Key    string `json:"key"`
	ModRev uint64 `json:"mod_rev"`
}

// TxnOp is one operation of a transaction, spelt as the event it makes:
// {"type":"put","key","value","lease"?} or {"type":"delete","key"}.
type TxnOp struct {
	Type  string `json:"type,omitempty"` // "put" or "delete"
	Key   string `json:"key"`
	Value Value  `json:"value,omitempty"`
	Lease string `json:"lease,omitempty"`
	// Op is the older spelling of Type, "put" or "del", still accepted
	// from clients that send it in place of Type.
	Op string `json:"op,omitempty"`
}

// Client message types.
const (
	TConnect = "connect"
	TAuth    = "auth"
	TPing    = "ping"
	TSub     = "sub"
	TUnsub   = "unsub"
	TPut     = "put"
	TDel     = "del"
	TTxn     = "txn"
)

// Answered reports whether a request of type t is answered with ok or
// err, and so must carry an id (PROTOCOL.md §4): every known type but
// connect and ping.
func Answered(t string) bool {
	switch t {
	case TAuth, TSub, TUnsub, TPut, TDel, TTxn:
		return true
	}
	return false
}

// Server message types.
const (
	TConnected    = "connected"
	TOK           = "ok"
	TErr          = "err"
	TSnapshot     = "snapshot"
	TEvents       = "events"
	TCoalesced    = "coalesced"
	TSynced       = "synced"
	TProgress     = "progress"
	TUnsubscribed = "unsubscribed"
	TRefresh      = "refresh"
	TPong         = "pong"
)

// Event is one key's change in an events or coalesced message.
type Event struct {
	Type      string `json:"type"` // "put", "delete", or "leave" (a filtered sub's key left its result)
	Key       string `json:"key"`
	Value     Value  `json:"value,omitempty"`
	CreateRev uint64 `json:"create_rev,omitempty"`
	ModRev    uint64 `json:"mod_rev"`
	Version   uint64 `json:"version,omitempty"`
	Lease     bool   `json:"lease,omitempty"`
	Prev      *Item  `json:"prev,omitempty"` // Key left empty
	Wid       string `json:"wid,omitempty"`  // the client write id of the write
}

// Message is any server → client message, for clients to decode into;
// T says which fields apply. Servers encode the specific types below.
type Message struct {
	T            string  `json:"t"`
	ID           uint64  `json:"id,omitempty"`
	S            uint64  `json:"s,omitempty"`
	Rev          uint64  `json:"rev,omitempty"`
	Code         string  `json:"code,omitempty"`
	Message      string  `json:"message,omitempty"`
	Key          string  `json:"key,omitempty"`
	ModRev       uint64  `json:"mod_rev,omitempty"`
	Epoch        string  `json:"epoch,omitempty"`
	Reason       string  `json:"reason,omitempty"`
	Items        []Item  `json:"items,omitempty"`
	Events       []Event `json:"events,omitempty"`
	V            int     `json:"v,omitempty"`
	Session      string  `json:"session,omitempty"`
	Resume       string  `json:"resume,omitempty"`
	Resumed      bool    `json:"resumed,omitempty"`
	PingMS       int64   `json:"ping_ms,omitempty"`
	LeaseGraceMS int64   `json:"lease_grace_ms,omitempty"`
	ExpiresMS    int64   `json:"expires_ms,omitempty"`
	Dup          bool    `json:"dup,omitempty"`
	Line         int     `json:"line,omitempty"`   // err invalid_filter
	Column       int     `json:"column,omitempty"` // err invalid_filter
}

// The server → client messages, one type each.

// Connected answers connect.
type Connected struct {
	T            string `json:"t"` // "connected"
	V            int    `json:"v"`
	Session      string `json:"session"`
	Resume       string `json:"resume"`
	Resumed      bool   `json:"resumed"`
	PingMS       int64  `json:"ping_ms"`
	LeaseGraceMS int64  `json:"lease_grace_ms"`
	ExpiresMS    int64  `json:"expires_ms,omitempty"`
}

// OK answers a request that succeeded.
type OK struct {
	T   string `json:"t"` // "ok"
	ID  uint64 `json:"id"`
	Rev uint64 `json:"rev,omitempty"`
	// Dup: the write's wid had already committed, at Rev; nothing was
	// applied now.
	Dup bool `json:"dup,omitempty"`
}

// Err answers a request that failed.
type Err struct {
	T       string  `json:"t"` // "err"
	ID      uint64  `json:"id,omitempty"`
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Key     string  `json:"key,omitempty"`
	ModRev  *uint64 `json:"mod_rev,omitempty"` // conflict only: always present there, 0 = absent key
	Rev     *uint64 `json:"rev,omitempty"`     // conflict only
	// Epoch is the epoch mod_rev and rev count in (conflict only): after
	// the store lost writes, a new one (see PROTOCOL.md, continuity).
	Epoch string `json:"epoch,omitempty"`
	// Line and Column (from 1) point at the fault of an invalid_filter.
	Line   int `json:"line,omitempty"`
	Column int `json:"column,omitempty"`
}

// Mark is a synced or progress marker of a subscription.
type Mark struct {
	T   string `json:"t"` // "synced" or "progress"
	S   uint64 `json:"s"`
	Rev uint64 `json:"rev"`
}

// Snapshot replaces a subscription's view.
type Snapshot struct {
	T      string `json:"t"` // "snapshot"
	S      uint64 `json:"s"`
	Epoch  string `json:"epoch"`
	Rev    uint64 `json:"rev"`
	Reason string `json:"reason"`
	Items  []Item `json:"items"`
}

// Item is a key with its value and revisions, as in snapshots and the
// HTTP API.
type Item struct {
	Key       string `json:"key"`
	Value     Value  `json:"value"`
	CreateRev uint64 `json:"create_rev"`
	ModRev    uint64 `json:"mod_rev"`
	Version   uint64 `json:"version"`
	Lease     bool   `json:"lease,omitempty"`
}

// Unsubscribed says the server ended a subscription.
type Unsubscribed struct {
	T       string `json:"t"` // "unsubscribed"
	S       uint64 `json:"s"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Refresh asks for a new token before the current one expires.
type Refresh struct {
	T         string `json:"t"` // "refresh"
	ExpiresMS int64  `json:"expires_ms"`
}

// Pong answers ping.
type Pong struct {
	T string `json:"t"` // "pong"
}

// Error codes of err messages (PROTOCOL.md §4).
const (
	CodeBadRequest     = "bad_request"
	CodeInvalidRoom    = "invalid_room"
	CodeInvalidKey     = "invalid_key"
	CodeInvalidValue   = "invalid_value"
	CodeInvalidFilter  = "invalid_filter"
	CodeTooLarge       = "too_large"
	CodeQuotaExceeded  = "quota_exceeded"
	CodeConflict       = "conflict"
	CodeWidReused      = "wid_reused"
	CodeUnauthorized   = "unauthorized"
	CodeForbidden      = "forbidden"
	CodeRateLimited    = "rate_limited"
	CodeTooManySubs    = "too_many_subscriptions"
	CodeNotFound       = "not_found"
	CodeOutcomeUnknown = "outcome_unknown"
	CodeUnavailable    = "unavailable"
	CodeInternal       = "internal"
)

// Close codes (PROTOCOL.md §8): 4000-4499 reconnect and resume,
// 4500-4999 do not reconnect automatically.
const (
	CloseSlowConsumer     websocket.StatusCode = 4000
	CloseHeartbeatTimeout websocket.StatusCode = 4001
	CloseTokenExpired     websocket.StatusCode = 4002
	CloseRateLimited      websocket.StatusCode = 4003
	CloseServerFull       websocket.StatusCode = 4004
	CloseConnectTimeout   websocket.StatusCode = 4005
	CloseProtocolError    websocket.StatusCode = 4500
	CloseUnauthorized     websocket.StatusCode = 4501
	CloseOriginRefused    websocket.StatusCode = 4502
	CloseSessionReplaced  websocket.StatusCode = 4503
)
