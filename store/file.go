package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// FileConfig configures a File store.
type FileConfig struct {
	// Path is the database file, for example data/statecast.db. Its
	// parent directory is created when missing.
	Path      string
	Limits    Limits
	Retention RetentionPolicy
	// Clock is the time source for commit times and age retention;
	// defaults to time.Now.
	Clock func() time.Time
	// Logger receives commit failures; nil discards them.
	Logger *slog.Logger
}

// File is the embedded, durable Store: one bbolt file holds every room's
// state, revision and retained history, and an epoch created with the file.
// Reopening the file gives the same epoch, revisions and history, so
// clients resume across a restart without a snapshot.
//
// Concurrency contract:
//   - All methods may be called concurrently.
//   - Apply validates its input on the caller's goroutine, copies the
//     values, and hands the write to a single committer goroutine. The
//     committer takes every write queued at that moment (up to
//     maxGroupWrites / maxGroupBytes) and applies them, in queue order, to
//     one open bbolt transaction, then appends what they changed to the
//     write-ahead log with one fdatasync (group commit; file_wal.go). Writes
//     in a group see each other: two writes to a room get consecutive
//     revisions and a condition sees an earlier write of the same group. A
//     write whose condition fails gets its *ConflictError and does not
//     affect the others; if the group fails, every write of it gets the
//     error and none of it is visible.
//   - Apply returns only after the log's fdatasync (a group of only
//     conflicts and no-ops logs nothing). A write abandoned through its
//     context before the committer took it is never committed; once taken,
//     Apply waits for the outcome (at most one group) rather than return an
//     ambiguous context error.
//   - A checkpoint commits the open transaction every checkpointEvery, or
//     when a reader needs it, and the log starts again.
//   - Follow callbacks run on the committer goroutine after the fdatasync,
//     in revision order per room, once per batch, under the followers lock:
//     once stop returns, fn is not called again. fn must not block nor
//     call into the store (not even stop): the committer would deadlock.
//   - Snapshot and History read one bbolt read transaction each, so they
//     are consistent. It starts once every answered write is checkpointed
//     and not while a checkpoint is being written, so a read sees every
//     answered revision and only durable ones; once started, it does not
//     block nor wait for writes.
//   - Close refuses new calls, lets the committer commit everything already
//     queued, waits for it to exit, then closes the file. Writes racing
//     Close either commit or get ErrClosed.
//
// Lock order of the fields below: docs/LOCKS.md.
type File struct {
	cfg   FileConfig
	db    *bolt.DB
	epoch string
	log   *slog.Logger

	// mu guards closed. Calls that use db or send on reqs hold it for
	// reading, so Close (which takes it for writing) never closes reqs
	// under a sender nor the db under a reader.
	mu     sync.RWMutex
	closed bool
	reqs   chan *fileReq
	done   chan struct{} // closed when the committer has exited

	// commitMu keeps read transactions from starting while a commit is
	// writing: bbolt makes a commit's meta page visible before its fsync,
	// and a reader must never see a revision a crash could still undo (a
	// client holding it would diverge from the same epoch after restart).
	commitMu sync.RWMutex

	// fmu guards followers and is held while callbacks run.
	fmu       sync.Mutex
	followers map[string]map[*func(Batch)]struct{}

	commits     atomic.Uint64 // groups made durable (each one fdatasync of the log), for figures and tests
	checkpoints atomic.Uint64 // bbolt commits, for tests

	// The committer's own: the log, the write transaction holding the
	// groups logged since the last checkpoint (nil: none), and why writes
	// or reads now fail (nil: they do not).
	wal      *walFile
	every    time.Duration // checkpointEvery; tests set it before writing
	tx       *bolt.Tx
	logged   [][]byte // the records tx holds, to rebuild it
	broken   error
	flushErr error
	// dirty: the open transaction holds answered writes, so a reader must
	// have it checkpointed first. Set by the committer before it answers.
	dirty atomic.Bool

	// Test hooks, set before writing.
	hookGroup  atomic.Pointer[func()]       // called once a group's first write is taken
	hookCommit atomic.Pointer[func() error] // an error aborts the group's transaction
	// an error fails the checkpoint as a failed bbolt commit would
	hookCheckpoint atomic.Pointer[func() error]
}

var _ Store = (*File)(nil)

const (
	fileFormat     = 1
	openTimeout    = 2 * time.Second // waiting for another process's lock
	maxGroupWrites = 128
	maxGroupBytes  = 4 << 20
	// checkpointEvery bounds how long logged groups wait for their bbolt
	// commit (etcd's backend commits every 100 ms too): the longer, the
	// more groups share each page written, and the more a restart replays.
	checkpointEvery = 100 * time.Millisecond
)

// bbolt layout:
//
//	meta/format           → fileFormat
//	meta/epoch            → epoch id
//	rooms/<room>/meta     → roomMeta record
//	rooms/<room>/logbytes → logBytes record: the size of the retained log
//	rooms/<room>/usage    → usage record: the room's keys and bytes (its quota)
//	rooms/<room>/kv/<key> → kv record
//	rooms/<room>/log/<rev as 8-byte big endian> → batch record
//	rooms/<room>/wids/<wid> → uvarint(rev): the write ids of the logged
//	                          batches (created by the first write with one)
//	rooms/<room>/widfps/<wid> → the fingerprint of the write (Write.Fingerprint);
//	                          a bucket of its own, so an older binary, which
//	                          decodes wids values strictly, reads this file as
//	                          it wrote it (its ids have no fingerprint)
var (
	bucketMeta  = []byte("meta")
	bucketRooms = []byte("rooms")
	keyFormat   = []byte("format")
	keyEpoch    = []byte("epoch")
	keyRoomMeta = []byte("meta")
	// keyLogBytes is a key of its own, not a field of the meta record: an
	// older binary decodes the meta record strictly and never lists a room
	// bucket's keys, so it reads a newer file as if the key were absent.
	keyLogBytes = []byte("logbytes")
	// keyUsage, beside meta for the same reason as keyLogBytes.
	keyUsage   = []byte("usage")
	bucketKV   = []byte("kv")
	bucketLog  = []byte("log")
	bucketWids = []byte("wids")
	bucketFps  = []byte("widfps")
)

// OpenFile opens (creating when missing) the database at cfg.Path and
// starts its committer. Close it to release the file.
func OpenFile(cfg FileConfig) (*File, error) {
	if cfg.Path == "" {
		return nil, errors.New("store: file store needs a path")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := checkFileLimits(cfg.Limits.WithDefaults()); err != nil {
		return nil, err
	}
	dir := filepath.Dir(cfg.Path)
	created := missingDirs(dir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("store: create data directory: %w", err)
	}
	db, err := bolt.Open(cfg.Path, 0o600, &bolt.Options{
		Timeout:      openTimeout,
		FreelistType: bolt.FreelistMapType,
	})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("store: %s is in use by another process", cfg.Path)
		}
		return nil, fmt.Errorf("store: open %s: %w", cfg.Path, err)
	}
	epoch, err := initFile(db)
	var wal *walFile
	if err == nil {
		wal, err = recoverWAL(db, cfg.Path+walSuffix)
	}
	if err == nil {
		err = syncDirs(dir, created)
	}
	if err != nil {
		if wal != nil {
			_ = wal.close()
		}
		_ = db.Close()
		return nil, fmt.Errorf("store: open %s: %w", cfg.Path, err)
	}
	f := &File{
		cfg:       cfg,
		db:        db,
		wal:       wal,
		every:     checkpointEvery,
		epoch:     epoch,
		log:       cfg.Logger,
		reqs:      make(chan *fileReq, maxGroupWrites),
		done:      make(chan struct{}),
		followers: make(map[string]map[*func(Batch)]struct{}),
	}
	go f.run()
	return f, nil
}

// missingDirs lists dir and those of its ancestors that do not exist yet,
// deepest first.
func missingDirs(dir string) []string {
	var out []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			return out
		}
		out = append(out, d)
		if filepath.Dir(d) == d {
			return out
		}
	}
}

// syncDirs fsyncs dir, which holds the database file's entry, and the
// parent of every directory OpenFile created: bbolt syncs the file but not
// the directory entries, and without them a crash right after the first
// acknowledged write could lose the whole file.
func syncDirs(dir string, created []string) error {
	dirs := []string{dir}
	for _, d := range created {
		dirs = append(dirs, filepath.Dir(d))
	}
	for _, d := range dirs {
		fd, err := os.Open(d)
		if err != nil {
			return err
		}
		err = fd.Sync()
		if cerr := fd.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("sync directory %s: %w", d, err)
		}
	}
	return nil
}

// checkFileLimits rejects limits bbolt cannot store, so a write that passes
// validation never fails inside a transaction for its size.
func checkFileLimits(l Limits) error {
	if l.MaxKeyBytes > bolt.MaxKeySize {
		return fmt.Errorf("store: MaxKeyBytes %d exceeds the file store's limit of %d", l.MaxKeyBytes, bolt.MaxKeySize)
	}
	// A batch record holds every op's key, value and previous value.
	if worst := int64(l.MaxOps) * (2*int64(l.MaxValueBytes) + int64(l.MaxKeyBytes) + 64); worst > bolt.MaxValueSize {
		return fmt.Errorf("store: MaxOps x MaxValueBytes too large for the file store (a batch record may reach %d bytes)", worst)
	}
	return nil
}

// recoverWAL opens the write-ahead log beside the bbolt file and commits
// the records a crash left in it (one transaction, with the next
// generation, so replaying them twice cannot happen).
func recoverWAL(db *bolt.DB, path string) (*walFile, error) {
	var gen uint64
	if err := db.View(func(tx *bolt.Tx) error { gen = walGen(tx); return nil }); err != nil {
		return nil, err
	}
	w, pending, err := openWAL(path, gen)
	if err != nil {
		return nil, fmt.Errorf("write-ahead log: %w", err)
	}
	if len(pending) == 0 {
		return w, nil
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for i, rec := range pending {
			if err := replay(tx, rec); err != nil {
				return fmt.Errorf("write-ahead log record %d: %w", i+1, err)
			}
		}
		return tx.Bucket(bucketMeta).Put(keyWalGen, binary.BigEndian.AppendUint64(nil, gen+1))
	})
	if err != nil {
		_ = w.close()
		return nil, err
	}
	w.restart(gen + 1)
	return w, nil
}

// initFile creates the format marker and the epoch on first open (one
// transaction, so a file never exists without its epoch) and reads them
// back on later opens.
func initFile(db *bolt.DB) (epoch string, err error) {
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketRooms); err != nil {
			return err
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			if meta, err = tx.CreateBucket(bucketMeta); err != nil {
				return err
			}
			epoch = NewEpoch()
			if err := meta.Put(keyFormat, []byte{fileFormat}); err != nil {
				return err
			}
			return meta.Put(keyEpoch, []byte(epoch))
		}
		if v := meta.Get(keyFormat); len(v) != 1 || v[0] != fileFormat {
			return fmt.Errorf("unsupported file format %v (want %d)", v, fileFormat)
		}
		v := meta.Get(keyEpoch)
		if len(v) == 0 {
			return fmt.Errorf("%w: no epoch", ErrCorrupt)
		}
		epoch = string(v)
		return nil
	})
	return epoch, err
}

// Commits returns how many groups of writes (each one fdatasync of the
// write-ahead log) the store has made durable since it was opened: for
// figures and tests.
func (f *File) Commits() uint64 { return f.commits.Load() }

// Epoch returns the store-wide epoch, fixed when the file was created.
func (f *File) Epoch() string { return f.epoch }

func revKey(rev uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), rev) }

func roomBucket(tx *bolt.Tx, room string) *bolt.Bucket {
	return tx.Bucket(bucketRooms).Bucket([]byte(room))
}

func readRoomMeta(rb *bolt.Bucket) (roomMeta, error) {
	v := rb.Get(keyRoomMeta)
	if v == nil {
		return roomMeta{}, fmt.Errorf("%w: room has no meta", ErrCorrupt)
	}
	return decodeMeta(v)
}

// readWindow reads a room's meta and the size of its retained log.
func readWindow(rb *bolt.Bucket) (roomMeta, error) {
	m, err := readRoomMeta(rb)
	if err != nil {
		return m, err
	}
	m.bytes, err = logBytes(rb, m)
	return m, err
}

// logBytes returns the size of m's retained log records (oldest..head):
// the stored total when it was written for this very window, else the sum
// of the records' lengths. A room whose last write was made by a version
// that kept no total (or by one after a downgrade) pays that scan once,
// on its next write, which stores the total; reads until then scan too.
// The scan reads keys and value lengths only, not the records' pages.
func logBytes(rb *bolt.Bucket, m roomMeta) (uint64, error) {
	if v := rb.Get(keyLogBytes); v != nil {
		lb, err := decodeLogBytes(v)
		if err != nil {
			return 0, err
		}
		if lb.head == m.head && lb.oldest == m.oldest {
			return lb.bytes, nil
		}
	}
	log := rb.Bucket(bucketLog)
	if log == nil || m.oldest > m.head {
		return 0, nil
	}
	var n uint64
	c, last := log.Cursor(), revKey(m.head)
	for k, v := c.Seek(revKey(m.oldest)); k != nil && bytes.Compare(k, last) <= 0; k, v = c.Next() {
		n += uint64(len(v))
	}
	return n, nil
}

// roomUsage returns the keys and bytes of a room at head: the stored
// count when it was written at head, else counted from kvb. A room last
// written by a version that kept no count (or by one after a downgrade)
// pays that scan once, on its next write, which stores the count.
func roomUsage(rb, kvb *bolt.Bucket, head uint64) (Usage, error) {
	if rb == nil || kvb == nil {
		return Usage{}, nil
	}
	if v := rb.Get(keyUsage); v != nil {
		at, u, err := decodeUsage(v)
		if err != nil {
			return Usage{}, err
		}
		if at == head {
			return u, nil
		}
	}
	var u Usage
	err := kvb.ForEach(func(k, v []byte) error {
		kv, err := decodeKV(string(k), v)
		if err != nil {
			return fmt.Errorf("key %q: %w", k, err)
		}
		u.Keys++
		u.Bytes += int64(len(k) + len(kv.Value))
		return nil
	})
	return u, err
}

// retained returns m with its history window narrowed to what ret keeps
// at now: it walks whole batches from the oldest while ret drops them (too
// many events, too old, or too many bytes of log records), reading only
// their headers. header reads a batch's time, event count and record
// size. The write path deletes what it drops; read paths only use the
// window, so an expired or over-budget batch is never served even before
// a write removes it.
func retained(m roomMeta, ret Retention, now time.Time, header func(rev uint64) (time.Time, uint64, uint64, error)) (roomMeta, error) {
	drops := func(oldestAt time.Time) bool {
		return ret.Drops(int(min(m.events, 1<<62)), oldestAt, now) || ret.OverBytes(int64(min(m.bytes, 1<<62)))
	}
	if ret.MaxAge <= 0 && !drops(now) {
		return m, nil // age aside, nothing drops: answer without reading the log
	}
	for m.oldest <= m.head {
		at, n, size, err := header(m.oldest)
		if err != nil {
			return m, err
		}
		if !drops(at) {
			break
		}
		if n > m.events || size > m.bytes {
			return m, fmt.Errorf("%w: room meta counts less history than its log holds", ErrCorrupt)
		}
		m.events -= n
		m.bytes -= size
		m.oldest++
	}
	return m, nil
}

// logHeader returns a header reader over a room's log bucket.
func logHeader(log *bolt.Bucket) func(rev uint64) (time.Time, uint64, uint64, error) {
	return func(rev uint64) (time.Time, uint64, uint64, error) {
		var v []byte
		if log != nil {
			v = log.Get(revKey(rev))
		}
		if v == nil {
			return time.Time{}, 0, 0, fmt.Errorf("%w: retained revision %d missing from the log", ErrCorrupt, rev)
		}
		at, n, err := decodeBatchHeader(v)
		return at, n, uint64(len(v)), err
	}
}

// readRoom reads a room's meta and its retention window as of now.
func (f *File) readRoom(rb *bolt.Bucket, room string) (roomMeta, error) {
	m, err := readWindow(rb)
	if err != nil {
		return m, err
	}
	return retained(m, f.cfg.Retention.For(room), f.cfg.Clock(), logHeader(rb.Bucket(bucketLog)))
}

// view runs fn in a read transaction that sees every answered write (and
// only durable ones). The caller holds f.mu for reading.
func (f *File) view(fn func(*bolt.Tx) error) error {
	if f.dirty.Load() {
		// Answered writes wait in the committer's transaction: have it
		// checkpointed (one commit for every reader waiting meanwhile).
		req := &fileReq{flush: true, done: make(chan struct{})}
		f.reqs <- req
		<-req.done
		if req.err != nil {
			return req.err
		}
	}
	f.commitMu.RLock()
	tx, err := f.db.Begin(false)
	f.commitMu.RUnlock()
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	return fn(tx)
}

// begin checks room and that the store is open. On success the caller
// holds f.mu for reading and must call f.mu.RUnlock.
func (f *File) begin(room string) error {
	if err := ValidRoom(room); err != nil {
		return err
	}
	f.mu.RLock()
	if f.closed {
		f.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (f *File) Leased(ctx context.Context, fn func(room string, kv KV) error) error {
	// One scan of every room's keys: this runs once, at start-up.
	return f.eachRoom(ctx, func(room string, rb *bolt.Bucket) error {
		kvb := rb.Bucket(bucketKV)
		if kvb == nil {
			return nil
		}
		return kvb.ForEach(func(k, v []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			kv, err := decodeKV(string(k), v)
			if err != nil {
				return fmt.Errorf("room %q key %q: %w", room, k, err)
			}
			if kv.Lease == "" {
				return nil
			}
			return fn(room, kv)
		})
	})
}

// eachRoom calls fn with every room's bucket, from one read transaction
// that sees every answered write, until fn or ctx fails.
func (f *File) eachRoom(ctx context.Context, fn func(room string, rb *bolt.Bucket) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return ErrClosed
	}
	return f.view(func(tx *bolt.Tx) error {
		rooms := tx.Bucket(bucketRooms)
		if rooms == nil {
			return nil
		}
		return rooms.ForEachBucket(func(name []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fn(string(name), rooms.Bucket(name))
		})
	})
}

func (f *File) Snapshot(ctx context.Context, room, prefix string) (Snapshot, error) {
	if err := f.begin(room); err != nil {
		return Snapshot{}, err
	}
	defer f.mu.RUnlock()
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	s := Snapshot{Epoch: f.epoch, Oldest: 1}
	err := f.view(func(tx *bolt.Tx) error {
		rb := roomBucket(tx, room)
		if rb == nil {
			return nil // never written
		}
		m, err := f.readRoom(rb, room)
		if err != nil {
			return err
		}
		s.Rev, s.Oldest = m.head, m.oldest
		kvb := rb.Bucket(bucketKV)
		if kvb == nil {
			return fmt.Errorf("%w: room has no kv bucket", ErrCorrupt)
		}
		// Keys are stored sorted, so a prefix is one contiguous range.
		p := []byte(prefix)
		c := kvb.Cursor()
		k, v := c.First()
		if len(p) > 0 {
			k, v = c.Seek(p)
		}
		for ; k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			kv, err := decodeKV(string(k), v)
			if err != nil {
				return fmt.Errorf("room %q key %q: %w", room, k, err)
			}
			s.Items = append(s.Items, kv)
		}
		return nil
	})
	if err != nil {
		return Snapshot{}, err
	}
	return s, nil
}

func (f *File) History(ctx context.Context, room string, from uint64, limit int) ([]Batch, error) {
	if err := f.begin(room); err != nil {
		return nil, err
	}
	defer f.mu.RUnlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []Batch
	err := f.view(func(tx *bolt.Tx) error {
		m := roomMeta{oldest: 1} // a never-written room: head 0, nothing retained
		rb := roomBucket(tx, room)
		if rb != nil {
			var err error
			if m, err = f.readRoom(rb, room); err != nil {
				return err
			}
		}
		if from < m.oldest {
			return &CompactedError{Oldest: m.oldest}
		}
		if from > m.head {
			return nil
		}
		log := rb.Bucket(bucketLog)
		if log == nil {
			return fmt.Errorf("%w: room has no log bucket", ErrCorrupt)
		}
		c := log.Cursor()
		n, want := 0, from
		for k, v := c.Seek(revKey(from)); k != nil && want <= m.head; k, v = c.Next() {
			if len(k) != 8 || binary.BigEndian.Uint64(k) != want {
				return fmt.Errorf("%w: room %q log has a gap at revision %d", ErrCorrupt, room, want)
			}
			_, events, err := decodeBatchHeader(v)
			if err != nil {
				return fmt.Errorf("room %q revision %d: %w", room, want, err)
			}
			if limit > 0 && n > 0 && n+int(events) > limit {
				return nil
			}
			b, err := decodeBatch(f.epoch, want, v)
			if err != nil {
				return fmt.Errorf("room %q revision %d: %w", room, want, err)
			}
			out = append(out, b)
			n += len(b.Events)
			want++
		}
		if want <= m.head {
			return fmt.Errorf("%w: room %q log ends before revision %d", ErrCorrupt, room, want)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (f *File) Follow(room string, fn func(Batch)) (stop func(), err error) {
	if err := f.begin(room); err != nil {
		return nil, err
	}
	f.mu.RUnlock()
	key := &fn
	f.fmu.Lock()
	fs := f.followers[room]
	if fs == nil {
		fs = make(map[*func(Batch)]struct{})
		f.followers[room] = fs
	}
	fs[key] = struct{}{}
	f.fmu.Unlock()
	return func() {
		f.fmu.Lock()
		defer f.fmu.Unlock()
		if fs := f.followers[room]; fs != nil {
			delete(fs, key)
			if len(fs) == 0 {
				delete(f.followers, room)
			}
		}
	}, nil
}

// Close stops accepting calls, commits the writes already queued, stops
// the committer and closes the file.
func (f *File) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return ErrClosed
	}
	f.closed = true
	close(f.reqs) // no sender holds f.mu now, and none will send again
	f.mu.Unlock()
	<-f.done
	werr := f.wal.close()
	if err := f.db.Close(); err != nil {
		return err
	}
	if f.broken != nil {
		return f.broken // what was not checkpointed is in the log, for the next open
	}
	return werr
}

// Limits returns the limits the store enforces (with defaults filled in).
func (f *File) Limits() Limits { return f.cfg.Limits.WithDefaults() }
