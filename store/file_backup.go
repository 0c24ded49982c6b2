package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"
)

var (
	_ Exporter = (*File)(nil)
	_ Importer = (*File)(nil)
)

func (f *File) BackupHeader() BackupHeader { return BackupHeader{Store: "file", Epoch: f.epoch} }

// Export reads every room from one bbolt read transaction, so the images
// share one point: every write answered before Export started is in them,
// none committed after. Writes go on meanwhile (docs/BACKUP.md).
func (f *File) Export(ctx context.Context, fn func(*RoomImage) error) error {
	return f.eachRoom(ctx, func(room string, rb *bolt.Bucket) error {
		img, err := f.exportRoom(rb, room)
		if err != nil || img.Head == 0 {
			return err
		}
		return fn(img)
	})
}

func (f *File) exportRoom(rb *bolt.Bucket, room string) (*RoomImage, error) {
	m, err := f.readRoom(rb, room)
	if err != nil {
		return nil, fmt.Errorf("room %q: %w", room, err)
	}
	img := &RoomImage{Room: room, Epoch: f.epoch, Head: m.head, Oldest: m.oldest}
	if kvb := rb.Bucket(bucketKV); kvb != nil {
		err = kvb.ForEach(func(k, v []byte) error {
			kv, err := decodeKV(string(k), v)
			img.Items = append(img.Items, kv)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("room %q: %w", room, err)
		}
	}
	log, fps := rb.Bucket(bucketLog), rb.Bucket(bucketFps)
	for rev := m.oldest; rev <= m.head; rev++ {
		var v []byte
		if log != nil {
			v = log.Get(revKey(rev))
		}
		if v == nil {
			return nil, fmt.Errorf("%w: room %q: retained revision %d missing from the log", ErrCorrupt, room, rev)
		}
		b, err := decodeBatch(f.epoch, rev, v)
		if err != nil {
			return nil, fmt.Errorf("room %q revision %d: %w", room, rev, err)
		}
		if wid := batchWid(b.Events); wid != "" && fps != nil {
			if fp := fps.Get([]byte(wid)); fp != nil {
				if img.Fingerprints == nil {
					img.Fingerprints = map[string]string{}
				}
				img.Fingerprints[wid] = string(fp)
			}
		}
		img.History = append(img.History, b)
	}
	return img, nil
}

// Import writes img in a bbolt transaction beside the committer's, shared
// with the Imports running at the same time (bolt's Batch: one commit for
// them all). It is meant for a store no server uses (restore, migrate),
// and followers are not told.
func (f *File) Import(ctx context.Context, img *RoomImage) error {
	if err := f.begin(img.Room); err != nil {
		return err
	}
	defer f.mu.RUnlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	return f.db.Batch(func(tx *bolt.Tx) error {
		rooms := tx.Bucket(bucketRooms)
		if rooms.Bucket([]byte(img.Room)) != nil {
			if err := rooms.DeleteBucket([]byte(img.Room)); err != nil {
				return err
			}
		}
		rb, err := rooms.CreateBucket([]byte(img.Room))
		if err != nil {
			return err
		}
		return importRoom(rb, img)
	})
}

func importRoom(rb *bolt.Bucket, img *RoomImage) error {
	kvb, err := rb.CreateBucket(bucketKV)
	if err != nil {
		return err
	}
	var u Usage
	for i := range img.Items {
		kv := &img.Items[i]
		if err := kvb.Put([]byte(kv.Key), encodeKV(kv)); err != nil {
			return err
		}
		u.Keys++
		u.Bytes += int64(len(kv.Key) + len(kv.Value))
	}
	logb, err := rb.CreateBucket(bucketLog)
	if err != nil {
		return err
	}
	m := roomMeta{head: img.Head, oldest: img.Oldest}
	var wids, fps *bolt.Bucket
	for i := range img.History {
		b := &img.History[i]
		rec := encodeBatch(b)
		if err := logb.Put(revKey(b.Rev), rec); err != nil {
			return err
		}
		m.events += uint64(len(b.Events))
		m.bytes += uint64(len(rec))
		wid := batchWid(b.Events)
		if wid == "" {
			continue
		}
		if wids == nil {
			if wids, err = rb.CreateBucket(bucketWids); err != nil {
				return err
			}
			if fps, err = rb.CreateBucket(bucketFps); err != nil {
				return err
			}
		}
		if err := wids.Put([]byte(wid), binary.AppendUvarint(nil, b.Rev)); err != nil {
			return err
		}
		if fp := img.Fingerprints[wid]; fp != "" {
			if err := fps.Put([]byte(wid), []byte(fp)); err != nil {
				return err
			}
		}
	}
	if err := rb.Put(keyRoomMeta, encodeMeta(m)); err != nil {
		return err
	}
	if err := rb.Put(keyLogBytes, encodeLogBytes(m)); err != nil {
		return err
	}
	return rb.Put(keyUsage, encodeUsage(m.head, u))
}

// Rooms lists the rooms that have a revision, from one read transaction.
func (f *File) Rooms(ctx context.Context, fn func(room, epoch string, head uint64) error) error {
	return f.eachRoom(ctx, func(room string, rb *bolt.Bucket) error {
		m, err := readRoomMeta(rb)
		if err != nil || m.head == 0 {
			return err
		}
		return fn(room, f.epoch, m.head)
	})
}

// SetFileEpoch gives the file store at path (closed, and holding no room)
// the epoch epoch, so a migration from a store of one epoch keeps it.
func SetFileEpoch(path, epoch string) error {
	if epoch == "" {
		return errors.New("store: empty epoch")
	}
	if _, err := os.Stat(path); err != nil {
		return err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: openTimeout})
	if err != nil {
		return fmt.Errorf("store: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		rooms, meta := tx.Bucket(bucketRooms), tx.Bucket(bucketMeta)
		if rooms == nil || meta == nil {
			return fmt.Errorf("%w: not a file store", ErrCorrupt)
		}
		if k, _ := rooms.Cursor().First(); k != nil {
			if bytes.Equal(meta.Get(keyEpoch), []byte(epoch)) {
				return nil
			}
			return errors.New("store: the file store holds rooms: its epoch cannot change")
		}
		return meta.Put(keyEpoch, []byte(epoch))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}
