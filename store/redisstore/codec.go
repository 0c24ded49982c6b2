package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/statecast/statecast/store"
)

// Redis encodings. Both are built by apply.lua with plain concatenation and
// are length-prefixed, so keys, values and leases are binary-safe.
//
// A key's record (the value of its field in the room's kv hash, and the
// body of an event):
//
//	<mod_rev>,<create_rev>,<version>,<len>:<lease><len>:<value>
//
// A batch (the stream entry's d field and the pub/sub payload, the same
// bytes):
//
//	B1<len>:<epoch><rev>;<unix ms>;<len>:<tag><len>:<prev tag><n>;<event>*n
//	B2<len>:<epoch><rev>;<unix ms>;<len>:<tag><len>:<prev tag><len>:<wid><n>;<event>*n
//
// (B2 for a write with an id, Write.Wid; B1, as before there were ids,
// for one without, so every entry a node of an earlier version wrote reads
// the same and such a node still reads the writes without an id.)
// where an event is P<len>:<key><record> (a put) or D<len>:<key><rev>; (a
// delete), followed by p<record> (the key before the change) or x (none).
// tag is unique per write; prev tag is the tag of the revision before it,
// so a node can tell that a revision it applied was replaced (a failover
// that lost writes) when the chain breaks.

var errCodec = errors.New("store: malformed redis record")

// batch is a decoded batch with its chain tags.
type batch struct {
	store.Batch
	tag, prevTag string
}

type decoder struct {
	s   string
	i   int
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s at byte %d", errCodec, what, d.i)
	}
}

// field returns the text up to term and moves past term.
func (d *decoder) field(term byte, what string) (string, bool) {
	if d.err != nil {
		return "", false
	}
	j := strings.IndexByte(d.s[d.i:], term)
	if j < 0 {
		d.fail(what)
		return "", false
	}
	f := d.s[d.i : d.i+j]
	d.i += j + 1
	return f, true
}

// uint reads a decimal number ended by term.
func (d *decoder) uint(term byte, what string) uint64 {
	f, ok := d.field(term, what)
	if !ok {
		return 0
	}
	n, err := strconv.ParseUint(f, 10, 64)
	if err != nil {
		d.fail(what)
	}
	return n
}

// int reads a signed decimal number ended by term.
func (d *decoder) int(term byte, what string) int64 {
	f, ok := d.field(term, what)
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(f, 10, 64)
	if err != nil {
		d.fail(what)
	}
	return n
}

// str reads <len>:<bytes>.
func (d *decoder) str(what string) string {
	n := d.uint(':', what)
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.s)-d.i) {
		d.fail(what)
		return ""
	}
	s := d.s[d.i : d.i+int(n)]
	d.i += int(n)
	return s
}

func (d *decoder) byte(what string) byte {
	if d.err != nil {
		return 0
	}
	if d.i >= len(d.s) {
		d.fail(what)
		return 0
	}
	b := d.s[d.i]
	d.i++
	return b
}

// record reads a key's record into a KV named key.
func (d *decoder) record(key string) store.KV {
	kv := store.KV{Key: key}
	kv.ModRev = d.uint(',', "mod_rev")
	kv.CreateRev = d.uint(',', "create_rev")
	kv.Version = d.uint(',', "version")
	kv.Lease = d.str("lease")
	kv.Value = []byte(d.str("value"))
	return kv
}

// decodeKV decodes the record of key as stored in the kv hash.
func decodeKV(key, rec string) (store.KV, error) {
	d := decoder{s: rec}
	kv := d.record(key)
	if d.err == nil && d.i != len(d.s) {
		d.fail("trailing bytes")
	}
	return kv, d.err
}

// decodeBatch decodes a batch as written by apply.lua.
func decodeBatch(s string) (batch, error) {
	d := decoder{s: s}
	if len(s) < 2 || s[:2] != "B1" && s[:2] != "B2" {
		return batch{}, fmt.Errorf("%w: unknown batch format", errCodec)
	}
	d.i = 2
	var b batch
	b.Epoch = d.str("epoch")
	b.Rev = d.uint(';', "rev")
	b.Time = time.UnixMilli(d.int(';', "time"))
	b.tag = d.str("tag")
	b.prevTag = d.str("prev tag")
	var wid string
	if s[1] == '2' {
		wid = d.str("wid")
	}
	n := d.uint(';', "event count")
	if d.err == nil && n > uint64(len(s)) {
		d.fail("event count")
	}
	if d.err != nil {
		return b, d.err
	}
	b.Events = make([]store.Event, 0, n)
	for range n {
		ev := store.Event{Wid: wid}
		switch d.byte("event type") {
		case 'P':
			ev.Type = store.OpPut
			key := d.str("key")
			ev.KV = d.record(key)
		case 'D':
			ev.Type = store.OpDelete
			ev.KV = store.KV{Key: d.str("key")}
			ev.KV.ModRev = d.uint(';', "delete rev")
		default:
			d.fail("event type")
		}
		switch d.byte("prev marker") {
		case 'p':
			p := d.record(ev.KV.Key)
			ev.Prev = &p
		case 'x':
		default:
			d.fail("prev marker")
		}
		if d.err != nil {
			return b, d.err
		}
		b.Events = append(b.Events, ev)
	}
	if d.i != len(s) {
		d.fail("trailing bytes")
	}
	return b, d.err
}
