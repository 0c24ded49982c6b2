package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	bolt "go.etcd.io/bbolt"
)

// The file store's write-ahead log. A bbolt commit costs two fsyncs and a
// write of every page the transaction touched: for a put to a large room,
// a leaf per key, its branches, the log's and the room's pages. So a group
// of writes is not committed to bbolt on its own: the committer applies it
// to one open write transaction and appends the group's changes to the
// log — one sequential write and one fdatasync — before answering its
// writers. A checkpoint commits that transaction (many groups, each page
// written once) every checkpointEvery, and the log starts again from its
// beginning. This is etcd's split between its WAL and its batched backend
// commits, for the same reason.
//
// A record is [4: payload length][4: CRC-32C of the payload][payload], the
// payload [8: generation][8: sequence][changes], each change
// [1: kind][1: depth][depth × (uvarint length, bucket name)][uvarint
// length, key][uvarint length, value: puts only]. The generation is the
// number of checkpoints the bbolt file has taken (meta/walgen, 1 before
// the first): the records of the current generation are exactly those the
// bbolt file lacks. A checkpoint commits the next generation's number with
// the transaction, so older records are dead the moment it is durable, and
// new ones overwrite them from offset 0. Recovery replays the records of
// the file's generation in sequence order from offset 0 and stops at the
// first that is torn, zero (never written), of another generation or out of
// sequence: an unfinished record belongs to a group nobody was told had
// committed.

const (
	walSuffix       = ".wal"
	walHeader       = 8
	walChunk        = 1 << 20  // the log grows (zero-filled) by this much
	walCheckpointAt = 64 << 20 // a checkpoint before the log outgrows this
)

var (
	keyWalGen = []byte("walgen")
	walCRC    = crc32.MakeTable(crc32.Castagnoli)
)

// Change kinds.
const (
	changePut byte = iota + 1
	changeDelete
	changeCreateBucket
)

// walFile is the log, owned by the committer once the store is open.
type walFile struct {
	f    *os.File
	gen  uint64 // generation of the records being written
	seq  uint64 // records of gen written so far
	off  int64  // end of the last record
	size int64  // bytes of the file: written with a record or zeros, so overwriting them changes no metadata
	buf  []byte
	sync func(*os.File) error // fdatasync; tests make it fail
}

// openWAL opens (creating) the log at path and reads the records of
// generation gen that follow the checkpoint: their change lists, which
// must be replayed before anything else is written.
func openWAL(path string, gen uint64) (*walFile, [][]byte, error) {
	fd, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, err
	}
	st, err := fd.Stat()
	if err != nil {
		_ = fd.Close()
		return nil, nil, err
	}
	w := &walFile{f: fd, gen: gen, size: st.Size(), sync: fdatasync}
	var pending [][]byte
	r := io.NewSectionReader(fd, 0, w.size)
	hdr := make([]byte, walHeader)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			break // the end of the file
		}
		n := int64(binary.BigEndian.Uint32(hdr))
		if n < 16 || w.off+walHeader+n > w.size {
			break // zeros past the last record, or a torn length
		}
		payload := make([]byte, n) // the replayed values live on in bbolt's transaction
		if _, err := io.ReadFull(r, payload); err != nil {
			break
		}
		if crc32.Checksum(payload, walCRC) != binary.BigEndian.Uint32(hdr[4:]) {
			break // torn
		}
		if binary.BigEndian.Uint64(payload) != gen || binary.BigEndian.Uint64(payload[8:]) != w.seq+1 {
			break // a dead generation's record, overwritten in part
		}
		w.seq++
		w.off += walHeader + n
		pending = append(pending, payload[16:])
	}
	return w, pending, nil
}

// append writes one group's changes as the next record and makes it
// durable.
func (w *walFile) append(changes []byte) error {
	n := 16 + len(changes)
	w.buf = binary.BigEndian.AppendUint32(w.buf[:0], uint32(n))
	w.buf = binary.BigEndian.AppendUint32(w.buf, 0)
	w.buf = binary.BigEndian.AppendUint64(w.buf, w.gen)
	w.buf = binary.BigEndian.AppendUint64(w.buf, w.seq+1)
	w.buf = append(w.buf, changes...)
	binary.BigEndian.PutUint32(w.buf[4:], crc32.Checksum(w.buf[walHeader:], walCRC))
	end := w.off + int64(len(w.buf))
	if end > w.size {
		// Grow by whole zeroed chunks: later records overwrite written
		// blocks, and an fdatasync of those flushes data only.
		grown := (end + walChunk - 1) / walChunk * walChunk
		if _, err := w.f.WriteAt(make([]byte, grown-w.size), w.size); err != nil {
			return err
		}
		w.size = grown
	}
	if _, err := w.f.WriteAt(w.buf, w.off); err != nil {
		return err
	}
	if err := w.sync(w.f); err != nil {
		return err
	}
	w.seq++
	w.off = end
	return nil
}

// restart begins generation gen from offset 0, once the bbolt file holds
// every record of the one before.
func (w *walFile) restart(gen uint64) { w.gen, w.seq, w.off = gen, 0, 0 }

func (w *walFile) close() error { return w.f.Close() }

// walGen reads the generation the log's live records carry.
func walGen(tx *bolt.Tx) uint64 {
	if v := tx.Bucket(bucketMeta).Get(keyWalGen); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 1
}

// changes applies changes to a write transaction and records each, so
// that replaying the record on the transaction's starting state redoes
// them exactly (the record holds results, not the writes that chose them:
// commit times, revisions, retention's choices).
type changes struct {
	tx  *bolt.Tx
	buf []byte
}

func (c *changes) put(path [][]byte, k, v []byte) error {
	k, v = c.record(changePut, path, k, v)
	return applyChange(c.tx, changePut, path, k, v)
}

func (c *changes) delete(path [][]byte, k []byte) error {
	k, _ = c.record(changeDelete, path, k, nil)
	return applyChange(c.tx, changeDelete, path, k, nil)
}

// createBucket creates bucket name under path (the root when path is
// empty) and returns it.
func (c *changes) createBucket(path [][]byte, name []byte) (*bolt.Bucket, error) {
	c.record(changeCreateBucket, path, name, nil)
	if err := applyChange(c.tx, changeCreateBucket, path, name, nil); err != nil {
		return nil, err
	}
	return bucketAt(c.tx, append(path[:len(path):len(path)], name))
}

// record appends a change to the record and returns its key and value as
// they sit in it: bbolt keeps what Put is given until the transaction
// ends, and the record is kept as long (to rebuild the transaction), so
// the two share one copy. Appending never moves bytes already handed out:
// a grown buffer is a new array, the old one stays with its readers.
func (c *changes) record(kind byte, path [][]byte, k, v []byte) (key, val []byte) {
	c.buf = append(c.buf, kind, byte(len(path)))
	for _, p := range path {
		c.buf = binary.AppendUvarint(c.buf, uint64(len(p)))
		c.buf = append(c.buf, p...)
	}
	key, c.buf = appendField(c.buf, k)
	if kind == changePut {
		val, c.buf = appendField(c.buf, v)
	}
	return key, val
}

func appendField(buf, b []byte) (field, out []byte) {
	buf = binary.AppendUvarint(buf, uint64(len(b)))
	start := len(buf)
	buf = append(buf, b...)
	return buf[start:len(buf):len(buf)], buf
}

// bucketAt finds the bucket at path (non-empty).
func bucketAt(tx *bolt.Tx, path [][]byte) (*bolt.Bucket, error) {
	b := tx.Bucket(path[0])
	for _, p := range path[1:] {
		if b == nil {
			break
		}
		b = b.Bucket(p)
	}
	if b == nil {
		return nil, fmt.Errorf("%w: no bucket %q", ErrCorrupt, path)
	}
	return b, nil
}

func applyChange(tx *bolt.Tx, kind byte, path [][]byte, k, v []byte) error {
	if kind == changeCreateBucket && len(path) == 0 {
		_, err := tx.CreateBucket(k)
		return err
	}
	b, err := bucketAt(tx, path)
	if err != nil {
		return err
	}
	switch kind {
	case changePut:
		return b.Put(k, v)
	case changeDelete:
		return b.Delete(k)
	case changeCreateBucket:
		_, err := b.CreateBucket(k)
		return err
	}
	return fmt.Errorf("%w: unknown change kind %d", ErrCorrupt, kind)
}

// replay applies a record's changes; values alias rec, which must outlive
// the transaction.
func replay(tx *bolt.Tx, rec []byte) error {
	bad := fmt.Errorf("%w: write-ahead log record cut short", ErrCorrupt)
	field := func() ([]byte, bool) {
		n, k := binary.Uvarint(rec)
		if k <= 0 || uint64(len(rec)-k) < n {
			return nil, false
		}
		f := rec[k : k+int(n) : k+int(n)]
		rec = rec[k+int(n):]
		return f, true
	}
	for len(rec) > 0 {
		if len(rec) < 2 {
			return bad
		}
		kind, depth := rec[0], int(rec[1])
		rec = rec[2:]
		path := make([][]byte, depth)
		for i := range path {
			p, ok := field()
			if !ok {
				return bad
			}
			path[i] = p
		}
		k, ok := field()
		if !ok {
			return bad
		}
		var v []byte
		if kind == changePut {
			if v, ok = field(); !ok {
				return bad
			}
		}
		if err := applyChange(tx, kind, path, k, v); err != nil {
			return err
		}
	}
	return nil
}

// errWALFailed is what every write gets once appending to the log failed:
// after a failed fdatasync the kernel may have dropped the pages it could
// not write, so no later record can be trusted to follow it. A restart
// recovers what reached the disk.
var errWALFailed = errors.New("store: the write-ahead log could not be written; writes are refused until a restart")
