package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Sessions is implemented by a store that keeps the server's sessions,
// so they outlive the process that opened them: a node restarted on the
// same file store (SIGTERM or SIGKILL) lets its clients resume their
// sessions, and the keys bound to them stay. A store without it keeps
// sessions in each node's memory only: a restart ends them after the
// lease grace.
//
// A record holds no secret: only the hash of the current resume secret.
type Sessions interface {
	// SaveSession writes rec, replacing the record of the same id. It
	// returns once the record is as durable as the store's writes.
	SaveSession(ctx context.Context, rec SessionRecord) error
	// Session returns the record of id; ok is false when there is none.
	Session(ctx context.Context, id string) (rec SessionRecord, ok bool, err error)
	// DeleteSession removes the record of id; a missing one is no error.
	DeleteSession(ctx context.Context, id string) error
	// ListSessions returns every record, in any order. A node calls it at
	// start-up.
	ListSessions(ctx context.Context) ([]SessionRecord, error)
}

// SessionRecord is what a node needs to resume a session it did not open
// (or opened in an earlier process). The keys bound to the session carry
// its lease on themselves (KV.Lease); a SharedSessions store also lists
// them beside the record (ListSessionKey), so that ending a session needs
// no scan of the rooms.
type SessionRecord struct {
	ID      string `json:"id"`
	Subject string `json:"subject"` // only this token subject may resume it
	// ResumeHash is the SHA-256 of the current resume secret; PrevHash
	// that of the one the client last presented, still accepted until it
	// presents the current one (it may never have received it).
	ResumeHash []byte `json:"resume_hash"`
	PrevHash   []byte `json:"prev_hash,omitempty"`
	// Lease is the session's lease id as the node names it ("session:<id>").
	Lease string `json:"lease"`

	// SharedSessions only (zero elsewhere). Owner is the node the session
	// is attached to, or was last; Gen counts its takeovers (the fence of
	// a detach); Deadline is when a detached session ends, in unix ms of
	// the store's clock (0 while attached).
	Owner    string `json:"owner,omitempty"`
	Gen      int64  `json:"gen,omitempty"`
	Deadline int64  `json:"deadline,omitempty"`
	// Took is the latest of when the connects that took the session over
	// were read by their nodes, in unix ms of the store's clock as the
	// nodes map theirs onto it (0: not known): the order of a client's
	// connects, whichever node read them.
	Took int64 `json:"took,omitempty"`
	// TookClock names the clock Took is on (on Redis: the process whose
	// TIME the nodes map onto): a Took is not compared with a read on
	// another, as after a failover.
	TookClock string `json:"took_clock,omitempty"`
	// Listed: the session was opened by a node that lists its keys
	// (ListSessionKey); a record without it (an older node's) is ended by
	// scanning the rooms for its lease.
	Listed bool `json:"listed,omitempty"`

	// Keys, set by EndDueSessions only, are the keys listed with the
	// session (ModRev 0: a listed key may have been rewritten since).
	Keys []LeaseKey `json:"-"`
}

// SharedSessions is implemented by a store that several nodes share
// (with Nodes): a session is resumed on whichever node its client
// reaches. The record is the authority, not any node's memory: every
// resume is a compare-and-set on it, and a session ends when its record's
// deadline passes, ended by whichever node takes it out of the store
// (EndDueSessions), exactly once.
type SharedSessions interface {
	Sessions
	// TakeSession hands session id to node when its record has subject
	// and the resume hash old, and has not passed its deadline: the
	// record gets the hash new, owner node, Gen+1 and no deadline. ok is
	// false otherwise (no record, another secret or subject, ended);
	// prev is the owner before.
	//
	// read is when node read the client's connect, or earlier: when it
	// accepted the connection the connect came on (zero: unknown; a
	// store that orders reads on a clock of its own may not know it
	// before node's first beat, store.Nodes). old
	// may be the hash presented at the last take instead of the current
	// one: that take's answer may never have reached the client, which
	// then presents the same secret again. But it may also be this
	// take that is late: its node read the connect, stalled, and the
	// client gave up on it and took the session over elsewhere, getting
	// the current secret. So a take presenting the previous hash whose
	// connect was read before that of the last take fails with
	// ErrStaleTake, and writes nothing: had it won, the client's secret
	// would be void and its session would end with nobody attached.
	TakeSession(ctx context.Context, id, subject string, old, new []byte, node string, read time.Time) (rec SessionRecord, prev string, ok bool, err error)
	// DetachSession starts the grace of session id if it is still
	// attached at generation gen: its deadline becomes now + grace.
	DetachSession(ctx context.Context, id string, gen int64, grace time.Duration) (bool, error)
	// SessionOwners returns the nodes that own attached sessions.
	SessionOwners(ctx context.Context) ([]string, error)
	// ReleaseSessions starts the grace of every session attached to one
	// of the dead nodes, and returns how many. It may read every session
	// of the cluster.
	ReleaseSessions(ctx context.Context, dead []string, grace time.Duration) (int, error)
	// ReleaseNodeSessions starts the grace of the sessions node attached,
	// from the store's list of them (no scan), and returns how many. It
	// may leave sessions a build before the lists attached:
	// ReleaseSessions finds those.
	ReleaseNodeSessions(ctx context.Context, node string, grace time.Duration) (int, error)
	// EndDueSessions removes up to max records whose deadline has passed
	// and returns them with their listed keys: of nodes racing, each
	// record goes to one, which deletes the keys that still carry the
	// session's lease (CurrentKeys) and then forgets the list.
	EndDueSessions(ctx context.Context, max int) ([]SessionRecord, error)
	// ListSessionKey lists key of room beside the record of session id.
	// NotListed: the record is gone (the session ended), and the caller
	// deletes the key, which must not outlive its session. ListFull: the
	// record does not say Listed (an older build's), or the session has
	// listed as many keys as the store keeps (then its record no longer
	// says so): it ends by a scan of the rooms.
	ListSessionKey(ctx context.Context, id, room, key string) (Listing, error)
	// ForgetSessionKeys drops the key list of an ended session once its
	// keys are deleted. A list nobody forgets (its ender died) expires.
	ForgetSessionKeys(ctx context.Context, id string) error
	// CurrentKeys returns those of keys that exist in room, as they are
	// now (with their lease and revision).
	CurrentKeys(ctx context.Context, room string, keys []string) ([]KV, error)
}

// Listing is what ListSessionKey did.
type Listing int

const (
	NotListed Listing = iota // the session's record is gone
	Listed                   // the key is listed with the session
	ListFull                 // the session's list is full: it ends by a scan
)

func encodeSession(rec SessionRecord) ([]byte, error) { return json.Marshal(rec) }

func decodeSession(v []byte) (SessionRecord, error) {
	var rec SessionRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return rec, fmt.Errorf("%w: session record: %v", ErrCorrupt, err)
	}
	return rec, nil
}
