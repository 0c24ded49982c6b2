package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The file store's records are hand-written varint encodings: compact,
// cheap to produce on the single committer goroutine, and decoded by code
// that checks every length against the bytes left, so a corrupt record is
// an error and never a panic or a huge allocation.
//
// Each record starts with a tag byte naming its kind and format version,
// so a record read from the wrong place (or from a future format) fails
// loudly instead of decoding into nonsense.
//
//	kv record:    tagKV    kvBody
//	batch record: tagBatch varint(unix seconds) uvarint(nanos) uvarint(n) event*n
//	              or, for a write with a client write id (its events' Wid):
//	              tagBatchWid varint(unix seconds) uvarint(nanos) uvarint(len(wid)) wid uvarint(n) event*n
//	event:        type uvarint(len(key)) key kvBody hasPrev(0|1) [kvBody of Prev]
//	meta record:  tagMeta  uvarint(head) uvarint(oldest) uvarint(retained events)
//	logBytes:     tagLogBytes uvarint(head) uvarint(oldest) uvarint(bytes of log records oldest..head)
//	usage:        tagUsage uvarint(head) uvarint(keys) uvarint(bytes of keys and values), counted at head
//	kvBody:       uvarint(create_rev) uvarint(mod_rev) uvarint(version) value lease
//	lease:        encoded as a value; nil when the key has no lease
//	value:        uvarint(0) for nil, else uvarint(len+1) bytes
//
// The key of a kv record, the revision of a batch and the epoch live
// outside the record (the bbolt key and the store meta), so they are not
// repeated in it. Prev.Key always equals the event's key.
const (
	tagKV    byte = 0xA1
	tagBatch byte = 0xB1
	// tagBatchWid: a batch with a write id. A batch without one keeps
	// tagBatch, byte for byte as before, so older binaries still read it.
	tagBatchWid byte = 0xB2
	tagMeta     byte = 0xC1
	// tagLogBytes: the record is new in this format, beside (not in) the
	// meta record, whose strict decoding older binaries still apply.
	tagLogBytes byte = 0xD1
	// tagUsage: new in this format too, a key of its own for the same
	// reason.
	tagUsage byte = 0xE1
)

// ErrCorrupt reports a stored record that cannot be decoded.
var ErrCorrupt = errors.New("store: corrupt record")

// minEventBytes is the smallest possible encoded event; it bounds how many
// events a record of a given size can claim before we allocate for them.
const minEventBytes = 7

func appendUvarint(dst []byte, v uint64) []byte { return binary.AppendUvarint(dst, v) }

func appendValue(dst, v []byte) []byte {
	if v == nil {
		return append(dst, 0)
	}
	dst = appendUvarint(dst, uint64(len(v))+1)
	return append(dst, v...)
}

func appendKVBody(dst []byte, kv *KV) []byte {
	dst = appendUvarint(dst, kv.CreateRev)
	dst = appendUvarint(dst, kv.ModRev)
	dst = appendUvarint(dst, kv.Version)
	dst = appendValue(dst, kv.Value)
	if kv.Lease == "" {
		return append(dst, 0)
	}
	return appendValue(dst, []byte(kv.Lease))
}

func kvBodySize(kv *KV) int { return 5*binary.MaxVarintLen64 + len(kv.Value) + len(kv.Lease) }

// encodeKV encodes the stored form of kv (without its key).
func encodeKV(kv *KV) []byte {
	return appendKVBody(append(make([]byte, 0, 1+kvBodySize(kv)), tagKV), kv)
}

// encodeBatch encodes b's time and events (not its epoch nor revision).
func encodeBatch(b *Batch) []byte {
	size := 1 + 3*binary.MaxVarintLen64
	for i := range b.Events {
		ev := &b.Events[i]
		size += 2 + binary.MaxVarintLen64 + len(ev.KV.Key) + kvBodySize(&ev.KV)
		if ev.Prev != nil {
			size += kvBodySize(ev.Prev)
		}
	}
	wid := batchWid(b.Events)
	tag := tagBatch
	if wid != "" {
		tag, size = tagBatchWid, size+binary.MaxVarintLen64+len(wid)
	}
	dst := append(make([]byte, 0, size), tag)
	dst = binary.AppendVarint(dst, b.Time.Unix())
	dst = appendUvarint(dst, uint64(b.Time.Nanosecond()))
	if wid != "" {
		dst = appendUvarint(dst, uint64(len(wid)))
		dst = append(dst, wid...)
	}
	dst = appendUvarint(dst, uint64(len(b.Events)))
	for i := range b.Events {
		ev := &b.Events[i]
		dst = append(dst, byte(ev.Type))
		dst = appendUvarint(dst, uint64(len(ev.KV.Key)))
		dst = append(dst, ev.KV.Key...)
		dst = appendKVBody(dst, &ev.KV)
		if ev.Prev == nil {
			dst = append(dst, 0)
		} else {
			dst = appendKVBody(append(dst, 1), ev.Prev)
		}
	}
	return dst
}

// roomMeta is a room's head revision and retained history window.
type roomMeta struct {
	head   uint64 // last committed revision
	oldest uint64 // oldest retained revision; head+1 when none
	events uint64 // events in revisions oldest..head
	// bytes is the size of the log records of revisions oldest..head. It
	// is not part of the meta record: it lives in the logBytes record,
	// which names the window it was counted for.
	bytes uint64
}

// encodeLogBytes encodes m's log size with the window it measures, so a
// total left behind by a write that did not update it (an older binary's)
// is recognized as stale rather than trusted.
func encodeLogBytes(m roomMeta) []byte {
	dst := append(make([]byte, 0, 1+3*binary.MaxVarintLen64), tagLogBytes)
	dst = appendUvarint(dst, m.head)
	dst = appendUvarint(dst, m.oldest)
	return appendUvarint(dst, m.bytes)
}

func decodeLogBytes(data []byte) (roomMeta, error) {
	d := decoder{b: data}
	d.tag(tagLogBytes, "log bytes")
	m := roomMeta{head: d.uvarint("head"), oldest: d.uvarint("oldest"), bytes: d.uvarint("bytes")}
	return m, d.end("log bytes")
}

// encodeUsage encodes a room's usage with the revision it was counted at,
// so a count left behind by a write that did not update it (an older
// binary's) is recognized as stale rather than trusted.
func encodeUsage(head uint64, u Usage) []byte {
	dst := append(make([]byte, 0, 1+3*binary.MaxVarintLen64), tagUsage)
	dst = appendUvarint(dst, head)
	dst = appendUvarint(dst, uint64(u.Keys))
	return appendUvarint(dst, uint64(u.Bytes))
}

func decodeUsage(data []byte) (head uint64, u Usage, err error) {
	d := decoder{b: data}
	d.tag(tagUsage, "usage")
	head, keys, n := d.uvarint("head"), d.uvarint("keys"), d.uvarint("bytes")
	if err := d.end("usage"); err != nil {
		return 0, Usage{}, err
	}
	if keys > 1<<62 || n > 1<<62 {
		return 0, Usage{}, fmt.Errorf("%w: usage of %d keys, %d bytes", ErrCorrupt, keys, n)
	}
	return head, Usage{Keys: int64(keys), Bytes: int64(n)}, nil
}

func encodeMeta(m roomMeta) []byte {
	dst := append(make([]byte, 0, 1+3*binary.MaxVarintLen64), tagMeta)
	dst = appendUvarint(dst, m.head)
	dst = appendUvarint(dst, m.oldest)
	return appendUvarint(dst, m.events)
}

// decoder reads a record; the first failure sticks, so callers check err
// once at the end.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) tag(want byte, kind string) {
	if len(d.b) == 0 || d.b[0] != want {
		d.fail("not a " + kind + " record")
		return
	}
	d.b = d.b[1:]
}

func (d *decoder) byte1(what string) byte {
	if len(d.b) == 0 {
		d.fail("truncated " + what)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint(what string) uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint in " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint in " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// raw returns the next n bytes without copying them.
func (d *decoder) raw(n uint64, what string) []byte {
	if n > uint64(len(d.b)) {
		d.fail(what + " longer than the record")
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

// value returns a copy: bbolt's bytes are only valid inside the transaction.
func (d *decoder) value() []byte {
	n := d.uvarint("value length")
	if n == 0 || d.err != nil {
		return nil
	}
	p := d.raw(n-1, "value")
	if d.err != nil {
		return nil
	}
	return append(make([]byte, 0, len(p)), p...)
}

func (d *decoder) kvBody(kv *KV) {
	kv.CreateRev = d.uvarint("create_rev")
	kv.ModRev = d.uvarint("mod_rev")
	kv.Version = d.uvarint("version")
	kv.Value = d.value()
	if lease := d.value(); lease != nil {
		kv.Lease = string(lease)
	}
}

func (d *decoder) end(kind string) error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes after " + kind + " record")
	}
	return d.err
}

// decodeKV decodes the kv record of key.
func decodeKV(key string, data []byte) (KV, error) {
	d := decoder{b: data}
	d.tag(tagKV, "kv")
	kv := KV{Key: key}
	d.kvBody(&kv)
	if err := d.end("kv"); err != nil {
		return KV{}, err
	}
	return kv, nil
}

// batchHeader decodes what retention needs: the commit time, the write id
// and the number of events, without touching the events themselves.
func (d *decoder) batchHeader() (time.Time, string, uint64) {
	withWid := len(d.b) > 0 && d.b[0] == tagBatchWid
	if withWid {
		d.b = d.b[1:]
	} else {
		d.tag(tagBatch, "batch")
	}
	sec := d.varint("time")
	nsec := d.uvarint("time")
	var wid string
	if withWid {
		wid = string(d.raw(d.uvarint("wid length"), "wid"))
		if d.err == nil && wid == "" {
			d.fail("empty wid")
		}
	}
	n := d.uvarint("event count")
	if d.err == nil && nsec >= uint64(time.Second) {
		d.fail("time nanoseconds out of range")
	}
	if d.err == nil && n > uint64(len(d.b))/minEventBytes {
		d.fail("event count larger than the record")
	}
	if d.err != nil {
		return time.Time{}, "", 0
	}
	return time.Unix(sec, int64(nsec)), wid, n
}

func decodeBatchHeader(data []byte) (time.Time, uint64, error) {
	d := decoder{b: data}
	t, _, n := d.batchHeader()
	return t, n, d.err
}

// decodeBatchWid returns the write id of a batch record, "" for none.
func decodeBatchWid(data []byte) (string, error) {
	d := decoder{b: data}
	_, wid, _ := d.batchHeader()
	return wid, d.err
}

// decodeBatch decodes the batch committed at rev under epoch.
func decodeBatch(epoch string, rev uint64, data []byte) (Batch, error) {
	d := decoder{b: data}
	t, wid, n := d.batchHeader()
	b := Batch{Epoch: epoch, Rev: rev, Time: t}
	if d.err != nil {
		return Batch{}, d.err
	}
	b.Events = make([]Event, n)
	for i := range b.Events {
		ev := &b.Events[i]
		ev.Wid = wid
		ev.Type = OpType(d.byte1("event type"))
		if d.err == nil && ev.Type != OpPut && ev.Type != OpDelete {
			d.fail("unknown event type")
		}
		ev.KV.Key = string(d.raw(d.uvarint("key length"), "key"))
		d.kvBody(&ev.KV)
		switch d.byte1("prev flag") {
		case 0:
		case 1:
			ev.Prev = &KV{Key: ev.KV.Key}
			d.kvBody(ev.Prev)
		default:
			d.fail("bad prev flag")
		}
		if d.err != nil {
			return Batch{}, d.err
		}
	}
	if err := d.end("batch"); err != nil {
		return Batch{}, err
	}
	return b, nil
}

func decodeMeta(data []byte) (roomMeta, error) {
	d := decoder{b: data}
	d.tag(tagMeta, "room meta")
	m := roomMeta{head: d.uvarint("head"), oldest: d.uvarint("oldest"), events: d.uvarint("events")}
	if err := d.end("room meta"); err != nil {
		return roomMeta{}, err
	}
	if m.oldest == 0 || m.oldest > m.head+1 || (m.oldest > m.head && m.events != 0) {
		return roomMeta{}, fmt.Errorf("%w: room meta head=%d oldest=%d events=%d is inconsistent", ErrCorrupt, m.head, m.oldest, m.events)
	}
	return m, nil
}
