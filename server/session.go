package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/statecast/statecast/store"
)

// sessions maps session ids to sessions. A session outlives its socket by
// the lease grace, so a client that reconnects quickly (connect with
// session + resume) keeps its session leases.
//
// On a store with store.Sessions, a session also has a record in the
// store (id, subject, hash of the resume secret) once it has something
// to keep: the record is written before the first key bound to the
// session commits (keep), and from then on kept in step with each
// resume and the end. A session that holds nothing needs no record yet,
// so a connect waits for no store commit (an fsync on the file store);
// a graceful shutdown writes the records of the sessions still without
// one, so only a crash loses those, and nothing with them: their clients
// get new sessions (resumed false). A node loads the records at
// start-up: each session gets its grace from then, as its leased keys do
// (lessor.recover), so a client that comes back within it resumes its
// session and keeps its keys across a restart, graceful or not. On a
// single-node store the memory is the authority once loaded: open looks
// nowhere else. On a store several nodes share (store.SharedSessions)
// the store's record is the authority and any node resumes any session:
// session_shared.go.
//
// Lock order: docs/LOCKS.md. Store calls hold only saveMu: a file store's
// fsync must not stall the others.
type sessions struct {
	leases  *lessor
	grace   time.Duration
	st      store.Sessions // nil: sessions live in this process only
	timeout time.Duration  // bounds each store call
	log     *slog.Logger

	// shared: the store several nodes share keeps the sessions
	// (session_shared.go); st is nil then.
	shared store.SharedSessions
	node   string        // this node's name in shared records
	every  time.Duration // shared: how often due sessions are ended
	// halt ends at shutdown: the sweeper stops, and its store calls run
	// under it, so a store that does not answer does not hold a shutdown.
	halt      context.Context
	haltSweep context.CancelFunc

	mu sync.Mutex
	m  map[string]*session
	// unsure (shared): sessions whose take, detach or save got no answer
	// from the store, so the record may be attached to this node with no
	// connection here; the sweeper starts their grace (session_shared.go).
	unsure map[string]bool
	// detachFails (shared): detaches that failed since the sweeper last
	// said how many; only the first of them is logged on its own.
	detachFails atomic.Int64
	// taking (shared): the sessions a take of this node is resuming, from
	// before the store's take until the session is in m.
	taking map[string]int
	closed bool           // shutting down: nothing ends any more
	wg     sync.WaitGroup // ends writing their record's delete
}

type session struct {
	id      string
	subject string // the token subject that opened it; only it may resume
	// resume is the SHA-256 of the newest secret issued to the client;
	// prev that of the secret it last presented, accepted until it
	// presents the newest: the `connected` carrying a new secret may never
	// reach it (a dropped socket, a crash, a page reloaded again at once).
	resume, prev [32]byte
	// took: the latest read (open) of the connects that took it over. A
	// connect read before it presenting prev is late, not a retry.
	took  time.Time
	lease string // this session's lease id
	gen   int64  // shared: the generation of the record's take it holds
	conn  *conn  // nil while detached
	timer *time.Timer
	ended bool // gone from sessions.m for good
	// kept: the session has a record in the store, or one is being
	// written; each change of the session from then on is persisted.
	kept bool

	// saveMu orders this session's store writes; each writes the state
	// as of when it runs, so the last one leaves the store in step.
	saveMu sync.Mutex
	// saved: a record write of the session succeeded (set under saveMu).
	saved atomic.Bool
}

func newSessions(l *lessor, grace time.Duration, st store.Sessions, timeout time.Duration, log *slog.Logger) *sessions {
	halt, haltSweep := context.WithCancel(context.Background())
	return &sessions{leases: l, grace: grace, st: st, timeout: timeout, log: log, m: make(map[string]*session),
		halt: halt, haltSweep: haltSweep, unsure: make(map[string]bool), taking: make(map[string]int)}
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
// secret is the session's new resume secret: each open rotates it, and
// when the session has a record (it holds keys: keep) the record has its
// hash before open returns, so a client holding it can resume after a
// crash; err says it could not be saved (the caller must not hand the
// secret out). A session without a record costs no store write here.
//
// read orders the client's connects: when c's upgrade was accepted,
// before the 101 after which the client sends its connect, so it comes
// before the connect however late this node reads it. A connect
// presenting the secret presented last (a retry after a lost answer)
// is refused with store.ErrStaleTake when read is before the read of
// the connect that took the session last: its client gave up on it.
func (ss *sessions) open(c *conn, id, resume, subject string, read time.Time) (s *session, secret string, resumed bool, old *conn, err error) {
	secret = randomID("r_")
	if ss.shared != nil {
		s, resumed, old, err = ss.openShared(c, id, resume, subject, secret, read)
		return s, secret, resumed, old, err
	}
	ss.mu.Lock()
	presented := sha256.Sum256([]byte(resume))
	s = ss.m[id]
	current := s != nil && subtle.ConstantTimeCompare(s.resume[:], presented[:]) == 1
	retry := s != nil && !current && subtle.ConstantTimeCompare(s.prev[:], presented[:]) == 1
	if retry && s.subject == subject && read.Before(s.took) {
		// Not a retry but a connect that waited (for the connect hook,
		// say) while its client gave up on it and resumed on another
		// socket: taking the session now would void the client's secret.
		ss.mu.Unlock()
		return nil, "", false, nil, store.ErrStaleTake
	}
	if s != nil && s.subject == subject && (current || retry) && ss.leases.hold(s.lease, subject) {
		if s.timer != nil {
			s.timer.Stop()
			s.timer = nil
		}
		old = s.conn
		s.conn = c
		s.prev = presented
		if read.After(s.took) {
			s.took = read
		}
		resumed = true
	} else {
		s = &session{id: randomID("s_"), subject: subject, conn: c}
		s.lease = sessionLeasePrefix + s.id
		ss.m[s.id] = s
		ss.leases.grantSession(s.lease, subject)
	}
	s.resume = sha256.Sum256([]byte(secret))
	// Once shutting down, a new session gets its record at once: the
	// shutdown has written the others' already (close).
	s.kept = s.kept || ss.closed
	save := s.kept
	ss.mu.Unlock()
	if !save {
		return s, secret, resumed, old, nil
	}
	return s, secret, resumed, old, ss.persist(s)
}

// keep writes s's record if it has none yet. A key bound to s's lease
// commits only after it: a client holding its resume secret can then
// resume its session after a crash, and keep the key. Once s has a
// record it costs nothing.
func (ss *sessions) keep(s *session) error {
	if ss.st == nil || s.saved.Load() {
		return nil
	}
	ss.mu.Lock()
	s.kept = true // from now on open persists each rotation of the secret
	ss.mu.Unlock()
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	if s.saved.Load() {
		return nil // written meanwhile, by another keep or a resume
	}
	return ss.persistLocked(s)
}

// detach marks c gone from s; unless a connection takes s over within the
// grace, the session ends and its lease with it. During a shutdown it
// does nothing: the session's grace starts at the next start.
func (ss *sessions) detach(s *session, c *conn) {
	if ss.shared != nil {
		ss.detachShared(s, c)
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s.conn != c || ss.closed {
		return // taken over already, or shutting down
	}
	s.conn = nil
	s.timer = time.AfterFunc(ss.grace, func() { ss.expire(s) })
}

// expire ends s unless it was taken over meanwhile: its record first,
// then its lease and keys. A crash in between leaves keys without a
// record, which the next start deletes after the grace; never a record
// whose keys are gone, which a client would resume as an empty session.
func (ss *sessions) expire(s *session) {
	ss.mu.Lock()
	if ss.closed || ss.m[s.id] != s || s.conn != nil {
		ss.mu.Unlock()
		return
	}
	delete(ss.m, s.id)
	s.ended = true
	// Without a record there is none to delete (a keep racing this one
	// finds the session ended and deletes instead of writing).
	kept := s.kept
	ss.wg.Add(1)
	ss.mu.Unlock()
	defer ss.wg.Done()
	if kept {
		if err := ss.persist(s); err != nil {
			ss.mu.Lock() // try again later; the session stays resumable meanwhile
			if !ss.closed && ss.m[s.id] == nil {
				s.ended = false
				ss.m[s.id] = s
				s.timer = time.AfterFunc(time.Second, func() { ss.expire(s) })
			}
			ss.mu.Unlock()
			return
		}
	}
	ss.leases.end(s.lease)
}

// persist writes s's record, or deletes it once s has ended.
func (ss *sessions) persist(s *session) error {
	if ss.st == nil {
		return nil
	}
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	return ss.persistLocked(s)
}

// persistLocked is persist with s.saveMu held.
func (ss *sessions) persistLocked(s *session) error {
	ss.mu.Lock()
	rec := store.SessionRecord{ID: s.id, Subject: s.subject, ResumeHash: s.resume[:], Lease: s.lease}
	if s.prev != ([32]byte{}) {
		rec.PrevHash = s.prev[:]
	}
	ended := s.ended
	ss.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), ss.timeout)
	defer cancel()
	var err error
	if ended {
		err = ss.st.DeleteSession(ctx, s.id)
	} else {
		err = ss.st.SaveSession(ctx, rec)
	}
	if err != nil {
		ss.log.Warn("server: cannot write a session record", "session", s.id, "ended", ended, "err", err)
	} else if !ended {
		s.saved.Store(true)
	}
	return err
}

// load takes over the sessions a previous process left in the store, each
// detached until its client comes back. It runs at start-up after the
// lessor's recover: a session whose keys recover adopted gets that lease
// back on resume; one without keys gets an empty lease. Either way the
// session and its lease end together, at the recovered deadline.
func (ss *sessions) load(ctx context.Context) error {
	if ss.st == nil {
		return nil
	}
	recs, err := ss.st.ListSessions(ctx)
	if err != nil {
		return err
	}
	var bad []string
	ss.mu.Lock()
	for _, rec := range recs {
		if len(rec.ResumeHash) != sha256.Size || rec.Lease == "" || ss.m[rec.ID] != nil {
			bad = append(bad, rec.ID)
			continue
		}
		s := &session{id: rec.ID, subject: rec.Subject, lease: rec.Lease, kept: true}
		s.saved.Store(true)
		copy(s.resume[:], rec.ResumeHash)
		if len(rec.PrevHash) == sha256.Size {
			copy(s.prev[:], rec.PrevHash)
		}
		deadline := ss.leases.restoreSession(s.lease, ss.grace)
		if rec.Deadline > 0 { // a restored backup's: its grace ran from the backup
			deadline = time.UnixMilli(rec.Deadline)
		}
		s.timer = time.AfterFunc(time.Until(deadline), func() { ss.expire(s) })
		ss.m[s.id] = s
	}
	ss.mu.Unlock()
	if len(recs) > 0 {
		ss.log.Info("server: loaded the sessions of a process that is gone; they end after the grace unless resumed", "sessions", len(recs)-len(bad), "grace", ss.grace)
	}
	for _, id := range bad {
		if err := ss.st.DeleteSession(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// close stops ending sessions (a shutdown must not) and forgets them.
// Their records and leases stay in the store for the next start; the
// sessions that had no record get one, so that a graceful restart ends
// no session.
func (ss *sessions) close() {
	if ss.shared != nil {
		ss.closeShared()
		return
	}
	var unkept []*session
	ss.mu.Lock()
	ss.closed = true
	ss.haltSweep()
	for id, s := range ss.m {
		if s.timer != nil {
			s.timer.Stop()
		}
		if !s.kept && ss.st != nil {
			s.kept = true
			unkept = append(unkept, s)
		}
		delete(ss.m, id)
	}
	ss.mu.Unlock()
	ss.saveAll(unkept)
	ss.wg.Wait()
}

// saveAll writes the records of sessions, many at a time so that the file
// store's group commit takes them in few fsyncs.
func (ss *sessions) saveAll(sessions []*session) {
	const inFlight = 128 // store.maxGroupWrites: a group commit's size
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	for _, s := range sessions {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = ss.persist(s) // logged; its client gets a new session after the restart, and loses nothing: it held nothing
		})
	}
	wg.Wait()
}
