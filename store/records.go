package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/errgroup"
)

// Session and TTL lease records travel with the rooms in backups and
// migrations (docs/BACKUP.md), so that a client resumes its session on
// the destination and a lease kept alive there keeps its keys.

// LeaseRecord is a TTL lease as a backup, a migration or a file store
// between two processes keeps it.
type LeaseRecord struct {
	ID     string `json:"id"`
	Holder string `json:"holder"` // the token subject that granted it ("" anonymous)
	TTLms  int64  `json:"ttl_ms"`
	// Deadline is when the lease ends unless kept alive, in unix ms of
	// the wall clock: carried as it is, never moved by the time a
	// migration or a restart takes.
	Deadline int64 `json:"deadline"`
}

// LeaseKeeper is a store of one node at a time that keeps the TTL leases
// of a server between two processes (the file store): a graceful shutdown
// writes them, the next start reads and deletes them. Keys carry the
// lease's name, not its holder or deadline.
type LeaseKeeper interface {
	SaveLeaseRecord(ctx context.Context, rec LeaseRecord) error
	DeleteLeaseRecord(ctx context.Context, id string) error
	LeaseRecords(ctx context.Context) ([]LeaseRecord, error)
}

// RecordImporter is a store that takes session and lease records from a
// backup or a migration, after their rooms. A session record's Deadline
// is unix ms of the wall clock, 0 for "its grace starts when a server
// next starts". keys are the keys of each lease (by lease id), as the
// images imported named them (CarryLeases).
type RecordImporter interface {
	ImportRecords(ctx context.Context, sessions []SessionRecord, leases []LeaseRecord, keys map[string][]LeaseKey) error
}

// CarryLeases names the keys of img bound to a carried lease (a session's
// "session:<id>" or a TTL lease's id, in carried) by the bare lease name:
// the source may store it behind a node ("<node>/<lease>"), which the
// destination does not know. It adds each key of a carried lease to keys.
// Keys of leases not carried keep their name, and end as after a restart.
func CarryLeases(img *RoomImage, carried map[string]bool, keys map[string][]LeaseKey) {
	bare := func(l string) string {
		if i := strings.LastIndexByte(l, '/'); i >= 0 {
			return l[i+1:]
		}
		return l
	}
	for i := range img.Items {
		kv := &img.Items[i]
		if kv.Lease == "" || !carried[bare(kv.Lease)] {
			continue
		}
		kv.Lease = bare(kv.Lease)
		keys[kv.Lease] = append(keys[kv.Lease], LeaseKey{Room: img.Room, Key: kv.Key, ModRev: kv.ModRev})
	}
	for i := range img.History {
		for j := range img.History[i].Events {
			ev := &img.History[i].Events[j]
			for _, kv := range []*KV{&ev.KV, ev.Prev} {
				if kv != nil && kv.Lease != "" && carried[bare(kv.Lease)] {
					kv.Lease = bare(kv.Lease)
				}
			}
		}
	}
}

// bucketLeases holds the TTL lease records a graceful shutdown left:
// leases/<id> → JSON LeaseRecord.
var bucketLeases = []byte("leases")

var (
	_ LeaseKeeper    = (*File)(nil)
	_ RecordImporter = (*File)(nil)
)

func (f *File) SaveLeaseRecord(ctx context.Context, rec LeaseRecord) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return f.writeRecord(ctx, &recordWrite{bucket: bucketLeases, id: rec.ID, rec: v})
}

func (f *File) DeleteLeaseRecord(ctx context.Context, id string) error {
	return f.writeRecord(ctx, &recordWrite{bucket: bucketLeases, id: id})
}

func (f *File) LeaseRecords(ctx context.Context) ([]LeaseRecord, error) {
	var out []LeaseRecord
	err := f.readRecords(ctx, bucketLeases, func(b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			var rec LeaseRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("%w: lease record %q: %v", ErrCorrupt, k, err)
			}
			out = append(out, rec)
			return ctx.Err()
		})
	})
	return out, err
}

// ImportRecords writes the records for the next server start, which
// loads them (a file store lists no keys: the start finds them by their
// lease name).
// Many at a time, so that the group commit takes them in few fsyncs.
func (f *File) ImportRecords(ctx context.Context, sessions []SessionRecord, leases []LeaseRecord, _ map[string][]LeaseKey) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(maxGroupWrites)
	for _, rec := range sessions {
		g.Go(func() error { return f.SaveSession(ctx, rec) })
	}
	for _, rec := range leases {
		g.Go(func() error { return f.SaveLeaseRecord(ctx, rec) })
	}
	return g.Wait()
}
