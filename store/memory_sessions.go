package store

import (
	"context"
	"slices"
)

var _ Sessions = (*Memory)(nil)

// The memory store keeps session records for the life of the process
// only: a restarted memory store is a new epoch, and its sessions are
// gone with its state.

func (m *Memory) SaveSession(ctx context.Context, rec SessionRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if m.sessions == nil {
		m.sessions = make(map[string]SessionRecord)
	}
	rec.ResumeHash = slices.Clone(rec.ResumeHash)
	m.sessions[rec.ID] = rec
	return ctx.Err()
}

func (m *Memory) Session(ctx context.Context, id string) (SessionRecord, bool, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return SessionRecord{}, false, ErrClosed
	}
	rec, ok := m.sessions[id]
	rec.ResumeHash = slices.Clone(rec.ResumeHash)
	return rec, ok, ctx.Err()
}

func (m *Memory) DeleteSession(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	delete(m.sessions, id)
	return ctx.Err()
}

func (m *Memory) ListSessions(ctx context.Context) ([]SessionRecord, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	out := make([]SessionRecord, 0, len(m.sessions))
	for _, rec := range m.sessions {
		rec.ResumeHash = slices.Clone(rec.ResumeHash)
		out = append(out, rec)
	}
	return out, ctx.Err()
}
