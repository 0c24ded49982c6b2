package server

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"sync"
	"time"
)

// sessions maps session ids to sessions. A session outlives its socket by
// the lease grace, so a client that reconnects quickly (connect with
// session + resume) keeps its session leases.
type sessions struct {
	leases *lessor
	grace  time.Duration

	mu sync.Mutex
	m  map[string]*session
}

type session struct {
	id      string
	subject string // the token subject that opened it; only it may resume
	resume  string // secret the client presents to take the session over
	lease   string // this session's lease id
	conn    *conn  // nil while detached
	timer   *time.Timer
}

func newSessions(l *lessor, grace time.Duration) *sessions {
	return &sessions{leases: l, grace: grace, m: make(map[string]*session)}
}

func randomID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// open attaches c to the session id when resume is its secret, subject
// the subject that opened it, and it is still alive; else to a new
// session of subject. A resume secret alone does not carry a session to
// another subject: that connection gets a new session, and the old one
// is left as it was (attached, or ending after its grace). old is the
// connection the session was taken from, to be closed by the caller.
func (ss *sessions) open(c *conn, id, resume, subject string) (s *session, resumed bool, old *conn) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s = ss.m[id]; s != nil && subtle.ConstantTimeCompare([]byte(s.resume), []byte(resume)) == 1 &&
		s.subject == subject && ss.leases.hold(s.lease) {
		if s.timer != nil {
			s.timer.Stop()
			s.timer = nil
		}
		old = s.conn
		s.conn = c
		s.resume = randomID("r_")
		return s, true, old
	}
	s = &session{id: randomID("s_"), subject: subject, resume: randomID("r_"), conn: c}
	s.lease = "session:" + s.id
	ss.m[s.id] = s
	ss.leases.grantSession(s.lease, subject)
	return s, false, nil
}

// detach marks c gone from s; unless a connection takes s over within the
// grace, the session ends and its lease with it.
func (ss *sessions) detach(s *session, c *conn) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s.conn != c {
		return // taken over already
	}
	s.conn = nil
	ss.leases.release(s.lease, ss.grace)
	s.timer = time.AfterFunc(ss.grace, func() {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if ss.m[s.id] == s && s.conn == nil {
			delete(ss.m, s.id)
		}
	})
}

// close forgets every session. Their leases stay in the store and are
// ended by the next start's recovery unless taken over.
func (ss *sessions) close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for id, s := range ss.m {
		if s.timer != nil {
			s.timer.Stop()
		}
		delete(ss.m, id)
	}
}
