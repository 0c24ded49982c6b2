package store

import (
	"context"
	"errors"

	bolt "go.etcd.io/bbolt"
)

// bucketSessions holds the server's session records: sessions/<id> →
// JSON SessionRecord. An older binary never opens the bucket.
var bucketSessions = []byte("sessions")

var _ Sessions = (*File)(nil)

// recordWrite is a session or lease record's put (rec set) or delete
// (rec nil) in bucket. It goes through the committer like a room write,
// so the records of a thousand clients resuming at once share the group
// commits (one fsync per group) instead of paying an fsync each.
type recordWrite struct {
	bucket []byte
	id     string
	rec    []byte
}

func (sw *recordWrite) apply(c *changes) (changed bool, fatal error) {
	path := [][]byte{sw.bucket}
	b := c.tx.Bucket(sw.bucket)
	if sw.rec == nil {
		if b == nil || b.Get([]byte(sw.id)) == nil {
			return false, nil
		}
		if err := c.delete(path, []byte(sw.id)); err != nil {
			return false, &fatalError{err}
		}
		return true, nil
	}
	if b == nil {
		if _, err := c.createBucket(nil, sw.bucket); err != nil {
			return false, &fatalError{err}
		}
	}
	if err := c.put(path, []byte(sw.id), sw.rec); err != nil {
		return false, &fatalError{err}
	}
	return true, nil
}

func (f *File) writeRecord(ctx context.Context, sw *recordWrite) error {
	if sw.id == "" || len(sw.id) > bolt.MaxKeySize {
		return errors.New("store: a session or lease id must be 1 to 32768 bytes")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := f.submit(ctx, &fileReq{sess: sw, size: 64 + len(sw.id) + len(sw.rec), done: make(chan struct{})})
	return err
}

func (f *File) SaveSession(ctx context.Context, rec SessionRecord) error {
	v, err := encodeSession(rec)
	if err != nil {
		return err
	}
	return f.writeRecord(ctx, &recordWrite{bucket: bucketSessions, id: rec.ID, rec: v})
}

func (f *File) DeleteSession(ctx context.Context, id string) error {
	return f.writeRecord(ctx, &recordWrite{bucket: bucketSessions, id: id})
}

func (f *File) Session(ctx context.Context, id string) (rec SessionRecord, ok bool, err error) {
	err = f.readRecords(ctx, bucketSessions, func(b *bolt.Bucket) error {
		v := b.Get([]byte(id))
		if v == nil {
			return nil
		}
		rec, err = decodeSession(v)
		ok = err == nil
		return err
	})
	return rec, ok, err
}

func (f *File) ListSessions(ctx context.Context) ([]SessionRecord, error) {
	var out []SessionRecord
	err := f.readRecords(ctx, bucketSessions, func(b *bolt.Bucket) error {
		return b.ForEach(func(_, v []byte) error {
			rec, err := decodeSession(v)
			if err != nil {
				return err
			}
			out = append(out, rec)
			return ctx.Err()
		})
	})
	return out, err
}

// readRecords runs fn on bucket, if there is one, in a read transaction
// that sees only fsynced commits.
func (f *File) readRecords(ctx context.Context, bucket []byte, fn func(*bolt.Bucket) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return f.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		if b == nil {
			return nil
		}
		return fn(b)
	})
}
