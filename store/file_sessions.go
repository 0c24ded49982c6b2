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

// sessionWrite is a session record's put (rec set) or delete (rec nil).
// It goes through the committer like a room write, so the records of a
// thousand clients resuming at once share the group commits (one fsync
// per group) instead of paying an fsync each.
type sessionWrite struct {
	id  string
	rec []byte
}

func (sw *sessionWrite) apply(c *changes) (changed bool, fatal error) {
	path := [][]byte{bucketSessions}
	b := c.tx.Bucket(bucketSessions)
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
		if _, err := c.createBucket(nil, bucketSessions); err != nil {
			return false, &fatalError{err}
		}
	}
	if err := c.put(path, []byte(sw.id), sw.rec); err != nil {
		return false, &fatalError{err}
	}
	return true, nil
}

func (f *File) writeSession(ctx context.Context, sw *sessionWrite) error {
	if sw.id == "" || len(sw.id) > bolt.MaxKeySize {
		return errors.New("store: session id must be 1 to 32768 bytes")
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
	return f.writeSession(ctx, &sessionWrite{id: rec.ID, rec: v})
}

func (f *File) DeleteSession(ctx context.Context, id string) error {
	return f.writeSession(ctx, &sessionWrite{id: id})
}

func (f *File) Session(ctx context.Context, id string) (rec SessionRecord, ok bool, err error) {
	err = f.readSessions(ctx, func(b *bolt.Bucket) error {
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
	err := f.readSessions(ctx, func(b *bolt.Bucket) error {
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

// readSessions runs fn on the sessions bucket, if there is one, in a read
// transaction that sees only fsynced commits.
func (f *File) readSessions(ctx context.Context, fn func(*bolt.Bucket) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return f.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSessions)
		if b == nil {
			return nil
		}
		return fn(b)
	})
}
