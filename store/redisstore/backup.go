package redisstore

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
)

var (
	_ store.Exporter = (*Store)(nil)
	_ store.Importer = (*Store)(nil)
)

// BackupHeader: rooms on Redis each have their own epoch.
func (s *Store) BackupHeader() store.BackupHeader { return store.BackupHeader{Store: "redis"} }

// roomNames lists the rooms that have a meta hash, by one SCAN of the meta
// keys on every master, sorted.
func (s *Store) roomNames(ctx context.Context) ([]string, error) {
	var (
		mu    sync.Mutex
		rooms = map[string]struct{}{}
	)
	pattern := globEscape(s.cfg.Prefix) + ":{*}:meta"
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			r, ok := strings.CutPrefix(it.Val(), s.cfg.Prefix+":{")
			if r, ok2 := strings.CutSuffix(r, "}:meta"); ok && ok2 && store.ValidRoom(r) == nil {
				mu.Lock()
				rooms[r] = struct{}{}
				mu.Unlock()
			}
		}
		return it.Err()
	}
	var err error
	if s.cluster != nil {
		err = s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.rc)
	}
	if err != nil {
		return nil, fmt.Errorf("store: redis: listing rooms: %w", err)
	}
	names := make([]string, 0, len(rooms))
	for r := range rooms {
		names = append(names, r)
	}
	sort.Strings(names)
	return names, nil
}

// Export reads each room in one MULTI (meta, every key, the whole log), so
// each image is the room at one revision; rooms are read one after the
// other, not at one common instant (docs/BACKUP.md).
func (s *Store) Export(ctx context.Context, fn func(*store.RoomImage) error) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	names, err := s.roomNames(ctx)
	if err != nil {
		return err
	}
	for _, room := range names {
		img, err := s.exportRoom(ctx, room)
		if err != nil {
			return err
		}
		if img == nil {
			continue
		}
		if err := fn(img); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (s *Store) exportRoom(ctx context.Context, room string) (*store.RoomImage, error) {
	k := s.keys(room)
	var (
		metaCmd *redis.SliceCmd
		kvCmd   *redis.MapStringStringCmd
		logCmd  *redis.XMessageSliceCmd
	)
	_, err := s.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		metaCmd = p.HMGet(ctx, k.meta, metaFields...)
		kvCmd = p.HGetAll(ctx, k.kv)
		logCmd = p.XRange(ctx, k.log, "-", "+")
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: redis: reading room %q: %w", room, err)
	}
	m := parseMeta(metaCmd.Val())
	if m.epoch == "" || m.rev == 0 {
		return nil, nil // gone meanwhile, or only read
	}
	img := &store.RoomImage{Room: room, Epoch: m.epoch, Head: m.rev, Oldest: m.rev + 1}
	for key, rec := range kvCmd.Val() {
		kv, err := decodeKV(key, rec)
		if err != nil {
			return nil, fmt.Errorf("store: redis room %q key %q: %w", room, key, err)
		}
		img.Items = append(img.Items, kv)
	}
	sort.Slice(img.Items, func(i, j int) bool { return img.Items[i].Key < img.Items[j].Key })
	for _, e := range logCmd.Val() {
		rev := entryRev(e.ID)
		if rev < m.floor || rev > m.rev {
			continue
		}
		if len(img.History) == 0 {
			img.Oldest = rev
		} else if rev != img.Oldest+uint64(len(img.History)) {
			return nil, fmt.Errorf("store: redis room %q: log has a gap before revision %d", room, rev)
		}
		b, err := decodeBatch(entryField(e, "d"))
		if err != nil {
			return nil, fmt.Errorf("store: redis room %q revision %d: %w", room, rev, err)
		}
		if wid, fp := entryField(e, "w"), entryField(e, "f"); wid != "" && fp != "" {
			if img.Fingerprints == nil {
				img.Fingerprints = map[string]string{}
			}
			img.Fingerprints[wid] = fp
		}
		img.History = append(img.History, b.Batch)
	}
	if len(img.History) > 0 && img.Oldest+uint64(len(img.History)) != m.rev+1 {
		return nil, fmt.Errorf("store: redis room %q: log ends before its head %d", room, m.rev)
	}
	return img, nil
}

// Import writes the room in one MULTI (all its keys share its hash tag):
// the log entries, keys and write ids as apply.lua writes them, the batches
// re-encoded under img.Epoch with fresh tags, then meta. It replaces what
// Redis held of the room. It is meant for a store no node serves: a node
// following the room is not told.
func (s *Store) Import(ctx context.Context, img *store.RoomImage) error {
	if err := store.ValidRoom(img.Room); err != nil {
		return err
	}
	if img.Epoch == "" {
		return fmt.Errorf("store: redis: importing room %q without an epoch", img.Room)
	}
	if err := s.begin(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	k := s.keys(img.Room)
	var (
		cum, events uint64
		tag         string
	)
	_, err := s.wc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, k.meta, k.kv, k.log, k.wids)
		prevTag := ""
		for i := range img.History {
			b := &img.History[i]
			tag = s.id + "." + strconv.FormatUint(s.seq.Add(1), 36)
			wid := firstWid(b.Events)
			data := encodeBatch(img.Epoch, b, tag, prevTag, wid)
			vals := []any{"d", data, "n", strconv.Itoa(len(b.Events)), "t", strconv.FormatInt(b.Time.UnixMilli(), 10), "c", strconv.FormatUint(cum, 10)}
			if wid != "" {
				vals = append(vals, "w", wid)
				if fp := img.Fingerprints[wid]; fp != "" { // none: matches any, as an older build's entry
					vals = append(vals, "f", fp)
				}
				p.ZAdd(ctx, k.wids, redis.Z{Score: float64(b.Rev), Member: wid})
			}
			p.XAdd(ctx, &redis.XAddArgs{Stream: k.log, ID: strconv.FormatUint(b.Rev, 10) + "-0", Values: vals})
			cum += uint64(len(data) + len(wid) + entryBytes)
			events += uint64(len(b.Events))
			prevTag = tag
		}
		if tag == "" {
			tag = s.id + "." + strconv.FormatUint(s.seq.Add(1), 36)
		}
		var ubytes int
		for i := 0; i < len(img.Items); i += pageSize {
			page := img.Items[i:min(i+pageSize, len(img.Items))]
			args := make([]any, 0, 2*len(page))
			for j := range page {
				args = append(args, page[j].Key, encodeRecord(&page[j]))
				ubytes += len(page[j].Key) + len(page[j].Value)
			}
			p.HSet(ctx, k.kv, args...)
		}
		head := strconv.FormatUint(img.Head, 10)
		p.HSet(ctx, k.meta, "rev", head, "epoch", img.Epoch, "events", strconv.FormatUint(events, 10),
			"floor", strconv.FormatUint(img.Oldest, 10), "tag", tag, "cum", strconv.FormatUint(cum, 10), "base", "0",
			"ukeys", strconv.Itoa(len(img.Items)), "ubytes", strconv.Itoa(ubytes), "urev", head)
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: redis: importing room %q: %w", img.Room, err)
	}
	return nil
}

// entryBytes is what an entry of the log costs beyond its batch and write
// id, as lua/retain.lua counts it.
const entryBytes = 64

func firstWid(evs []store.Event) string {
	if len(evs) == 0 {
		return ""
	}
	return evs[0].Wid
}

// encodeRecord encodes a key's record as apply.lua does (codec.go).
func encodeRecord(kv *store.KV) string {
	return strconv.FormatUint(kv.ModRev, 10) + "," + strconv.FormatUint(kv.CreateRev, 10) + "," +
		strconv.FormatUint(kv.Version, 10) + "," + lenStr(kv.Lease) + lenStr(string(kv.Value))
}

func lenStr(s string) string { return strconv.Itoa(len(s)) + ":" + s }

// encodeBatch encodes b as apply.lua does (codec.go).
func encodeBatch(epoch string, b *store.Batch, tag, prevTag, wid string) string {
	var sb strings.Builder
	if wid == "" {
		sb.WriteString("B1")
	} else {
		sb.WriteString("B2")
	}
	sb.WriteString(lenStr(epoch))
	sb.WriteString(strconv.FormatUint(b.Rev, 10) + ";" + strconv.FormatInt(b.Time.UnixMilli(), 10) + ";")
	sb.WriteString(lenStr(tag) + lenStr(prevTag))
	if wid != "" {
		sb.WriteString(lenStr(wid))
	}
	sb.WriteString(strconv.Itoa(len(b.Events)) + ";")
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Type == store.OpPut {
			sb.WriteString("P" + lenStr(ev.KV.Key) + encodeRecord(&ev.KV))
		} else {
			sb.WriteString("D" + lenStr(ev.KV.Key) + strconv.FormatUint(ev.KV.ModRev, 10) + ";")
		}
		if ev.Prev != nil {
			sb.WriteString("p" + encodeRecord(ev.Prev))
		} else {
			sb.WriteString("x")
		}
	}
	return sb.String()
}

// Rooms lists the rooms that have a revision, with their epoch and head.
func (s *Store) Rooms(ctx context.Context, fn func(room, epoch string, head uint64) error) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	names, err := s.roomNames(ctx)
	if err != nil {
		return err
	}
	for _, room := range names {
		v, err := s.rc.HMGet(ctx, s.keys(room).meta, metaFields...).Result()
		if err != nil {
			return fmt.Errorf("store: redis: reading room %q: %w", room, err)
		}
		if m := parseMeta(v); m.epoch != "" && m.rev > 0 {
			if err := fn(room, m.epoch, m.rev); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}
