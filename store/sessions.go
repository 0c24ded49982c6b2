package store

import (
	"context"
	"encoding/json"
	"fmt"
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
// its lease on themselves (KV.Lease), so the record does not list them.
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
}

func encodeSession(rec SessionRecord) ([]byte, error) { return json.Marshal(rec) }

func decodeSession(v []byte) (SessionRecord, error) {
	var rec SessionRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return rec, fmt.Errorf("%w: session record: %v", ErrCorrupt, err)
	}
	return rec, nil
}
