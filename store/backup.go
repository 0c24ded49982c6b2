package store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"
)

// A backup is a store-independent image of a store's rooms
// (docs/BACKUP.md): JSON lines, a header, then per room a room line, its
// keys and its retained history batches, then (version 2) a line per
// session and per TTL lease, then a trailer with the SHA-256 of every
// byte before it. It is written and read one room at a time.

// BackupFormat and BackupVersion name the format in a backup's header.
// Version 1 (rooms only) is still read.
const (
	BackupFormat  = "statecast-backup"
	BackupVersion = 2
)

// RoomImage is one room as a backup holds it: its keys and retained
// history at revision Head.
type RoomImage struct {
	Room   string
	Epoch  string // the room's epoch at the source
	Head   uint64
	Oldest uint64 // oldest retained revision; Head+1 when none
	Items  []KV   // sorted by key
	// History holds the revisions Oldest..Head, in order.
	History []Batch
	// Fingerprints of the write ids in History (Write.Fingerprint), where
	// the source keeps them.
	Fingerprints map[string]string
}

// Exporter is a store that can write its rooms into a backup.
type Exporter interface {
	// Export calls fn with every room that has a revision, each image
	// consistent at its Head. Which point in time the images share is the
	// store's to say (docs/BACKUP.md).
	Export(ctx context.Context, fn func(*RoomImage) error) error
	// BackupHeader names the store's kind and, when all its rooms share
	// one, its epoch.
	BackupHeader() BackupHeader
}

// Importer is a store that a backup can be restored into. It is meant for
// a store no server is using.
type Importer interface {
	// Import writes img as the room's whole state, revisions and history,
	// replacing whatever the store held of the room. A store with one
	// epoch for all rooms (file, memory) keeps its own; Redis writes the
	// room under img.Epoch.
	Import(ctx context.Context, img *RoomImage) error
	// Rooms calls fn with every room the store holds a revision of, and
	// its epoch and head.
	Rooms(ctx context.Context, fn func(room, epoch string, head uint64) error) error
}

// BackupHeader is a backup's first line.
type BackupHeader struct {
	Format  string    `json:"format"`
	Version int       `json:"version"`
	Store   string    `json:"store"`           // the source's kind: file, redis, memory
	Epoch   string    `json:"epoch,omitempty"` // the source's epoch, when one for all rooms
	Time    time.Time `json:"time"`
}

// The lines after the header. A room line is followed by exactly Keys key
// lines and Batches batch lines.
type (
	backupRoom struct {
		Room    string `json:"room"`
		Epoch   string `json:"epoch"`
		Head    uint64 `json:"head"`
		Oldest  uint64 `json:"oldest"`
		Keys    int    `json:"keys"`
		Batches int    `json:"batches"`
	}
	backupKV struct {
		Key       string `json:"k"`
		Value     []byte `json:"v"`
		CreateRev uint64 `json:"c"`
		ModRev    uint64 `json:"m"`
		Version   uint64 `json:"n"`
		Lease     string `json:"l,omitempty"`
	}
	backupEvent struct {
		Type OpType    `json:"o"`
		KV   backupKV  `json:"kv"`
		Prev *backupKV `json:"p,omitempty"`
	}
	backupBatch struct {
		Rev         uint64        `json:"r"`
		Time        time.Time     `json:"t"`
		Wid         string        `json:"w,omitempty"`
		Fingerprint string        `json:"f,omitempty"`
		Events      []backupEvent `json:"e"`
	}
	// A record line: one of the two is set.
	backupRecord struct {
		Session *SessionRecord `json:"session,omitempty"`
		Lease   *LeaseRecord   `json:"lease,omitempty"`
	}
	backupTrailer struct {
		End    bool   `json:"end"`
		Rooms  int    `json:"rooms"`
		SHA256 string `json:"sha256"`
	}
)

func toBackupKV(kv *KV) backupKV {
	return backupKV{Key: kv.Key, Value: kv.Value, CreateRev: kv.CreateRev, ModRev: kv.ModRev, Version: kv.Version, Lease: kv.Lease}
}

func (b *backupKV) kv() KV {
	return KV{Key: b.Key, Value: b.Value, CreateRev: b.CreateRev, ModRev: b.ModRev, Version: b.Version, Lease: b.Lease}
}

// BackupWriter writes a backup to w, hashing what it writes.
type BackupWriter struct {
	bw    *bufio.Writer
	sum   hash.Hash
	enc   *json.Encoder
	rooms int
	bytes int64
}

// NewBackupWriter writes h (Format and Version filled in) to w.
func NewBackupWriter(w io.Writer, h BackupHeader) (*BackupWriter, error) {
	bw := &BackupWriter{bw: bufio.NewWriterSize(w, 256<<10), sum: sha256.New()}
	bw.enc = json.NewEncoder(io.MultiWriter(bw.bw, bw.sum, countWriter{&bw.bytes}))
	h.Format, h.Version = BackupFormat, BackupVersion
	return bw, bw.enc.Encode(h)
}

type countWriter struct{ n *int64 }

func (c countWriter) Write(p []byte) (int, error) { *c.n += int64(len(p)); return len(p), nil }

// Room writes one room.
func (b *BackupWriter) Room(img *RoomImage) error {
	err := b.enc.Encode(backupRoom{Room: img.Room, Epoch: img.Epoch, Head: img.Head, Oldest: img.Oldest, Keys: len(img.Items), Batches: len(img.History)})
	for i := 0; err == nil && i < len(img.Items); i++ {
		err = b.enc.Encode(toBackupKV(&img.Items[i]))
	}
	for i := 0; err == nil && i < len(img.History); i++ {
		h := &img.History[i]
		bb := backupBatch{Rev: h.Rev, Time: h.Time, Wid: batchWid(h.Events), Events: make([]backupEvent, len(h.Events))}
		bb.Fingerprint = img.Fingerprints[bb.Wid]
		for j := range h.Events {
			ev := &h.Events[j]
			bb.Events[j] = backupEvent{Type: ev.Type, KV: toBackupKV(&ev.KV)}
			if ev.Prev != nil {
				p := toBackupKV(ev.Prev)
				bb.Events[j].Prev = &p
			}
		}
		err = b.enc.Encode(bb)
	}
	b.rooms++
	return err
}

// Records writes the session and TTL lease records, after the rooms. A
// session's Deadline is unix ms of the wall clock; its Owner, Gen and
// Listed are the source's and are not written.
func (b *BackupWriter) Records(sessions []SessionRecord, leases []LeaseRecord) error {
	for _, rec := range sessions {
		rec.Owner, rec.Gen, rec.Listed = "", 0, false
		if err := b.enc.Encode(backupRecord{Session: &rec}); err != nil {
			return err
		}
	}
	for _, rec := range leases {
		if err := b.enc.Encode(backupRecord{Lease: &rec}); err != nil {
			return err
		}
	}
	return nil
}

// Close writes the trailer and flushes; it does not close the writer.
func (b *BackupWriter) Close() error {
	t := backupTrailer{End: true, Rooms: b.rooms, SHA256: hex.EncodeToString(b.sum.Sum(nil))}
	line, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if _, err := b.bw.Write(append(line, '\n')); err != nil {
		return err
	}
	return b.bw.Flush()
}

// Rooms and Bytes are what has been written so far.
func (b *BackupWriter) Rooms() int   { return b.rooms }
func (b *BackupWriter) Bytes() int64 { return b.bytes }

// ErrBackupChecksum reports a backup whose trailer is missing or whose
// SHA-256 does not match its content.
var ErrBackupChecksum = errors.New("store: backup is truncated or corrupt (checksum)")

// BackupReader reads a backup one room at a time. Its checksum is checked
// when Next reaches the trailer: a caller that must not act on a corrupt
// backup reads it through once first (VerifyBackup).
type BackupReader struct {
	br     *bufio.Reader
	sum    hash.Hash
	Header BackupHeader
	rooms  int
	line   int
	// Sessions and Leases are the records read so far: all of them once
	// Next has returned io.EOF (they follow the rooms).
	Sessions []SessionRecord
	Leases   []LeaseRecord
}

// NewBackupReader reads the header of the backup in r.
func NewBackupReader(r io.Reader) (*BackupReader, error) {
	b := &BackupReader{br: bufio.NewReaderSize(r, 256<<10), sum: sha256.New()}
	if err := b.next(&b.Header); err != nil {
		return nil, fmt.Errorf("backup header: %w", err)
	}
	if b.Header.Format != BackupFormat {
		return nil, fmt.Errorf("not a statecast backup (format %q)", b.Header.Format)
	}
	if b.Header.Version != 1 && b.Header.Version != BackupVersion {
		return nil, fmt.Errorf("backup format version %d not supported (want %d)", b.Header.Version, BackupVersion)
	}
	return b, nil
}

// readLine returns the next line, hashed unless it is the trailer.
func (b *BackupReader) readLine() ([]byte, error) {
	line, err := b.br.ReadBytes('\n')
	if err == io.EOF && len(line) > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err == io.EOF {
		return nil, ErrBackupChecksum // no trailer
	}
	b.line++
	return line, err
}

func (b *BackupReader) next(v any) error {
	line, err := b.readLine()
	if err != nil {
		return err
	}
	b.sum.Write(line)
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("line %d: %w", b.line, err)
	}
	return nil
}

// Next returns the next room, or io.EOF after a trailer whose checksum
// matches.
func (b *BackupReader) Next() (*RoomImage, error) {
	line, err := b.readLine()
	for err == nil && (bytes.HasPrefix(line, []byte(`{"session":`)) || bytes.HasPrefix(line, []byte(`{"lease":`))) {
		b.sum.Write(line)
		if err = b.record(line); err == nil {
			line, err = b.readLine()
		}
	}
	if err != nil {
		return nil, err
	}
	if bytes.HasPrefix(line, []byte(`{"end":`)) {
		var t backupTrailer
		if err := json.Unmarshal(line, &t); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBackupChecksum, err)
		}
		if t.SHA256 != hex.EncodeToString(b.sum.Sum(nil)) || t.Rooms != b.rooms {
			return nil, ErrBackupChecksum
		}
		if _, err := b.br.ReadByte(); err != io.EOF {
			return nil, fmt.Errorf("%w: bytes after the trailer", ErrBackupChecksum)
		}
		return nil, io.EOF
	}
	b.sum.Write(line)
	var r backupRoom
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("line %d: %w", b.line, err)
	}
	if err := ValidRoom(r.Room); err != nil || r.Oldest == 0 || r.Oldest > r.Head+1 || r.Batches != int(r.Head+1-r.Oldest) || r.Keys < 0 {
		return nil, fmt.Errorf("line %d: bad room record %+v", b.line, r)
	}
	img := &RoomImage{Room: r.Room, Epoch: r.Epoch, Head: r.Head, Oldest: r.Oldest, Items: make([]KV, 0, min(r.Keys, 1<<16))}
	for range r.Keys {
		var kv backupKV
		if err := b.next(&kv); err != nil {
			return nil, err
		}
		img.Items = append(img.Items, kv.kv())
	}
	for i := range r.Batches {
		var bb backupBatch
		if err := b.next(&bb); err != nil {
			return nil, err
		}
		if bb.Rev != r.Oldest+uint64(i) || len(bb.Events) == 0 {
			return nil, fmt.Errorf("line %d: room %q: batch of revision %d out of order or empty", b.line, r.Room, bb.Rev)
		}
		batch := Batch{Rev: bb.Rev, Time: bb.Time, Events: make([]Event, len(bb.Events))}
		for j, e := range bb.Events {
			ev := Event{Type: e.Type, KV: e.KV.kv(), Wid: bb.Wid}
			if e.Prev != nil {
				p := e.Prev.kv()
				ev.Prev = &p
			}
			batch.Events[j] = ev
		}
		if bb.Wid != "" && bb.Fingerprint != "" {
			if img.Fingerprints == nil {
				img.Fingerprints = map[string]string{}
			}
			img.Fingerprints[bb.Wid] = bb.Fingerprint
		}
		img.History = append(img.History, batch)
	}
	b.rooms++
	return img, nil
}

// record reads a session or lease line.
func (b *BackupReader) record(line []byte) error {
	var rec backupRecord
	if err := json.Unmarshal(line, &rec); err != nil {
		return fmt.Errorf("line %d: %w", b.line, err)
	}
	switch {
	case b.Header.Version < 2:
		return fmt.Errorf("line %d: a record in a version %d backup", b.line, b.Header.Version)
	case rec.Session != nil && rec.Session.ID != "" && rec.Session.Lease != "":
		b.Sessions = append(b.Sessions, *rec.Session)
	case rec.Lease != nil && rec.Lease.ID != "" && rec.Lease.TTLms > 0:
		b.Leases = append(b.Leases, *rec.Lease)
	default:
		return fmt.Errorf("line %d: bad session or lease record", b.line)
	}
	return nil
}

// VerifyBackup reads the backup in r through and checks its checksum. The
// reader it returns has the header, the records and the rooms counted.
func VerifyBackup(r io.Reader) (*BackupReader, error) {
	br, err := NewBackupReader(r)
	if err != nil {
		return nil, err
	}
	for {
		if _, err := br.Next(); err == io.EOF {
			return br, nil
		} else if err != nil {
			return br, err
		}
	}
}

// Rooms is how many rooms have been read.
func (b *BackupReader) Rooms() int { return b.rooms }
