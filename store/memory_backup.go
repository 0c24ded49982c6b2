package store

import (
	"context"
	"sort"
)

var (
	_ Exporter = (*Memory)(nil)
	_ Importer = (*Memory)(nil)
)

// Epoch returns the store's epoch, new with every Memory.
func (m *Memory) Epoch() string { return m.epoch }

func (m *Memory) BackupHeader() BackupHeader { return BackupHeader{Store: "memory", Epoch: m.epoch} }

// roomList returns the rooms by name, sorted.
func (m *Memory) roomList() ([]string, map[string]*memRoom, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, nil, ErrClosed
	}
	names := make([]string, 0, len(m.rooms))
	rooms := make(map[string]*memRoom, len(m.rooms))
	for name, r := range m.rooms {
		names = append(names, name)
		rooms[name] = r
	}
	sort.Strings(names)
	return names, rooms, nil
}

// Export copies each room under its lock: every image is consistent at its
// head, and rooms are taken one after the other.
func (m *Memory) Export(ctx context.Context, fn func(*RoomImage) error) error {
	names, rooms, err := m.roomList()
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		r := rooms[name]
		r.mu.Lock()
		r.trimLocked(m.cfg.Retention.For(name), m.cfg.Clock())
		img := &RoomImage{Room: name, Epoch: m.epoch, Head: r.rev, Oldest: r.oldestLocked(), History: append([]Batch(nil), r.hist...)}
		for _, kv := range r.kv {
			img.Items = append(img.Items, kv)
		}
		for wid, rec := range r.wids {
			if img.Fingerprints == nil {
				img.Fingerprints = map[string]string{}
			}
			img.Fingerprints[wid] = rec.fp
		}
		r.mu.Unlock()
		if img.Head == 0 {
			continue
		}
		sort.Slice(img.Items, func(i, j int) bool { return img.Items[i].Key < img.Items[j].Key })
		if err := fn(img); err != nil {
			return err
		}
	}
	return nil
}

// Import replaces the room with img, under the store's epoch.
func (m *Memory) Import(ctx context.Context, img *RoomImage) error {
	r, err := m.room(img.Room, true)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.hist) > 0 {
		r.dropOldestLocked()
	}
	r.rev, r.kv, r.usage, r.wids = img.Head, make(map[string]KV, len(img.Items)), Usage{}, nil
	for _, kv := range img.Items {
		r.kv[kv.Key] = kv
		r.usage.Keys++
		r.usage.Bytes += int64(len(kv.Key) + len(kv.Value))
	}
	for _, b := range img.History {
		b.Epoch = m.epoch
		r.hist = append(r.hist, b)
		r.events += len(b.Events)
		n := BatchBytes(b.Events)
		r.bytes += n
		r.total.Add(n)
		if wid := batchWid(b.Events); wid != "" {
			if r.wids == nil {
				r.wids = make(map[string]widRecord)
			}
			r.wids[wid] = widRecord{rev: b.Rev, fp: img.Fingerprints[wid]}
		}
	}
	return ctx.Err()
}

// Rooms lists the rooms that have a revision.
func (m *Memory) Rooms(ctx context.Context, fn func(room, epoch string, head uint64) error) error {
	names, rooms, err := m.roomList()
	if err != nil {
		return err
	}
	for _, name := range names {
		r := rooms[name]
		r.mu.Lock()
		head := r.rev
		r.mu.Unlock()
		if head == 0 {
			continue
		}
		if err := fn(name, m.epoch, head); err != nil {
			return err
		}
	}
	return ctx.Err()
}
