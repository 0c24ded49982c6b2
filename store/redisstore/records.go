package redisstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
)

// Session and TTL lease records in backups and migrations (docs/BACKUP.md).

var _ store.RecordImporter = (*Store)(nil)

// importedOwner owns the sessions a migration brought that wait for a
// server: no node has this name, so the first node to start finds the
// owner dead and starts their grace (sessions.releaseDead).
const importedOwner = "imported"

// importLeaseScript writes a lease record with its deadline and its key
// list, replacing one of the same id (a migration run again).
// KEYS rec, due, held, ended; ARGV list prefix, id, holder, ttl ms,
// deadline, then room NUL key, mod_rev pairs.
var importLeaseScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 then redis.call('HINCRBY', KEYS[3], ARGV[3], 1) end
redis.call('HSET', KEYS[1], ARGV[2], cjson.encode({holder = ARGV[3], ttl_ms = tonumber(ARGV[4])}))
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[2])
redis.call('SREM', KEYS[4], ARGV[2])
local list = ARGV[1] .. ARGV[2]
redis.call('DEL', list)
for i = 6, #ARGV, 2 do redis.call('HSET', list, ARGV[i], ARGV[i + 1]) end
return 1`)

// ImportRecords writes the sessions, and the leases with their keys.
// A session whose deadline is 0 is attached to importedOwner: its grace
// starts when the first node starts. Deadlines are the wall clock's,
// taken as the Redis server's clock.
func (s *Store) ImportRecords(ctx context.Context, sessions []store.SessionRecord, leases []store.LeaseRecord, keys map[string][]store.LeaseKey) error {
	for _, rec := range sessions {
		rec.Owner, rec.Gen, rec.Listed, rec.Keys = "", 0, false, nil // ended by a scan of the rooms
		if rec.Deadline == 0 {
			rec.Owner = importedOwner
		}
		if err := s.SaveSession(ctx, rec); err != nil {
			return err
		}
	}
	lk, list := s.leaseKeys()
	for _, rec := range leases {
		args := []any{list, rec.ID, rec.Holder, rec.TTLms, rec.Deadline}
		for _, k := range keys[rec.ID] {
			args = append(args, k.Room+"\x00"+k.Key, k.ModRev)
		}
		if err := s.begin(); err != nil {
			return err
		}
		err := s.runWrite(ctx, importLeaseScript, lk, args...).Err()
		s.mu.RUnlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// LeaseRecords returns the TTL leases not yet ended, read in HSCAN and
// ZSCAN pages.
func (s *Store) LeaseRecords(ctx context.Context) ([]store.LeaseRecord, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	keys, _ := s.leaseKeys()
	recs := make(map[string]store.LeaseRecord)
	for cursor := uint64(0); ; {
		page, next, err := s.rc.HScan(ctx, keys[0], cursor, "", pageSize).Result()
		if err != nil {
			return nil, fmt.Errorf("store: redis: listing leases: %w", err)
		}
		for i := 0; i+1 < len(page); i += 2 {
			var r struct {
				Holder string  `json:"holder"`
				TTLms  float64 `json:"ttl_ms"`
			}
			if err := json.Unmarshal([]byte(page[i+1]), &r); err != nil {
				return nil, fmt.Errorf("%w: lease record %q: %v", store.ErrCorrupt, page[i], err)
			}
			recs[page[i]] = store.LeaseRecord{ID: page[i], Holder: r.Holder, TTLms: int64(r.TTLms)}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	out := make([]store.LeaseRecord, 0, len(recs))
	for cursor := uint64(0); ; {
		page, next, err := s.rc.ZScan(ctx, keys[1], cursor, "", pageSize).Result()
		if err != nil {
			return nil, fmt.Errorf("store: redis: listing lease deadlines: %w", err)
		}
		for i := 0; i+1 < len(page); i += 2 {
			rec, ok := recs[page[i]]
			var d float64
			if _, err := fmt.Sscan(page[i+1], &d); !ok || err != nil || math.IsInf(d, 0) {
				continue // ended meanwhile
			}
			rec.Deadline = int64(d)
			out = append(out, rec)
			delete(recs, page[i])
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}
