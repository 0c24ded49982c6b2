package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// denseCodec speaks statecast.v2.json (PROTOCOL.md §11): v1's JSON, with
// the events of events and coalesced messages and the items of snapshots
// as arrays. Field names were most of a v1 event's bytes; a client bound
// by what it parses keeps up with more events.
type denseCodec struct{ jsonCodec }

func (denseCodec) Subprotocol() string { return SubprotocolJSON2 }
func (denseCodec) Version() int        { return 2 }

func (c denseCodec) DecodeMessages(frame []byte) ([]Message, error) {
	return eachMessage(c, frame, decodeDense)
}

// Append writes events, coalesced and snapshot messages densely and every
// other message as v1 does.
func (c denseCodec) Append(buf []byte, msg any) ([]byte, error) {
	switch m := msg.(type) {
	case *Snapshot:
		return appendDenseSnapshot(buf, m.T, m.S, m.Epoch, m.Rev, m.Reason, m.Items), nil
	case Snapshot:
		return appendDenseSnapshot(buf, m.T, m.S, m.Epoch, m.Rev, m.Reason, m.Items), nil
	case *Message:
		switch m.T {
		case TEvents, TCoalesced:
			return c.AppendEvents(buf, m.T, m.S, m.Rev, c.AppendEventList(nil, m.Rev, m.Events)), nil
		case TSnapshot:
			return appendDenseSnapshot(buf, m.T, m.S, m.Epoch, m.Rev, m.Reason, m.Items), nil
		}
	}
	return c.jsonCodec.Append(buf, msg)
}

func appendDenseSnapshot(buf []byte, t string, s uint64, epoch string, rev uint64, reason string, items []Item) []byte {
	buf = appendSnapshotHeadJSON(buf, t, s, epoch, rev, reason)
	for i := range items {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendDenseItem(buf, &items[i])
	}
	return append(buf, "]}"...)
}

// appendDenseItem writes an item as [key, value, create_rev, mod_rev,
// version] and the extras object when it is leased.
func appendDenseItem(buf []byte, it *Item) []byte {
	buf = append(buf, '[')
	buf = appendJSONString(buf, it.Key)
	buf = append(buf, ',')
	buf = appendValueOrNull(buf, it.Value)
	buf = appendUints(buf, it.CreateRev, it.ModRev, it.Version)
	if it.Lease {
		buf = append(buf, `,{"l":1}`...)
	}
	return append(buf, ']')
}

// AppendEventList writes each event as [key, value, create_rev, version]
// (a put) or [key] (a delete or leave), then the extras object when one
// applies. Values are written as they are: every Value this package makes
// is canonical JSON.
func (denseCodec) AppendEventList(buf []byte, rev uint64, evs []Event) []byte {
	buf = append(buf, '[')
	for i := range evs {
		if i > 0 {
			buf = append(buf, ',')
		}
		e := &evs[i]
		buf = append(buf, '[')
		buf = appendJSONString(buf, e.Key)
		if e.Type == "put" {
			buf = append(buf, ',')
			buf = appendValueOrNull(buf, e.Value)
			buf = appendUints(buf, e.CreateRev, e.Version)
		}
		buf = appendExtras(buf, rev, e)
		buf = append(buf, ']')
	}
	return append(buf, ']')
}

// appendExtras appends ,{…} with what an event holds beyond the common
// case (PROTOCOL.md §11), or nothing.
func appendExtras(buf []byte, rev uint64, e *Event) []byte {
	n := 0
	if e.ModRev != rev {
		buf = appendExtra(buf, &n, "m")
		buf = strconv.AppendUint(buf, e.ModRev, 10)
	}
	if e.Lease {
		buf = append(appendExtra(buf, &n, "l"), '1')
	}
	if e.Wid != "" {
		buf = appendJSONString(appendExtra(buf, &n, "w"), e.Wid)
	}
	if p := e.Prev; p != nil {
		buf = append(appendExtra(buf, &n, "p"), '[')
		buf = appendValueOrNull(buf, p.Value)
		buf = appendUints(buf, p.CreateRev, p.ModRev, p.Version)
		if p.Lease {
			buf = append(buf, ",1"...)
		}
		buf = append(buf, ']')
	}
	if e.Type == "leave" {
		buf = append(appendExtra(buf, &n, "x"), '1')
	}
	if n > 0 {
		buf = append(buf, '}')
	}
	return buf
}

// appendExtra opens the extras object (n == 0) or continues it, and
// appends "name":.
func appendExtra(buf []byte, n *int, name string) []byte {
	if *n == 0 {
		buf = append(buf, ',', '{')
	} else {
		buf = append(buf, ',')
	}
	*n++
	buf = append(buf, '"')
	buf = append(buf, name...)
	return append(buf, '"', ':')
}

// appendUints appends ,n for each n.
func appendUints(buf []byte, ns ...uint64) []byte {
	for _, n := range ns {
		buf = append(buf, ',')
		buf = strconv.AppendUint(buf, n, 10)
	}
	return buf
}

func (denseCodec) AppendEvents(buf []byte, t string, s, rev uint64, list []byte) []byte {
	return appendEventsJSON(buf, t, s, `,"r":`, rev, `,"e":`, list)
}

func (denseCodec) AppendEventsHead(buf []byte, t string, s, rev uint64) []byte {
	return appendEventsHeadJSON(buf, t, s, `,"r":`, rev, `,"e":`)
}

func (denseCodec) EventsTail() []byte { return jsonEventsTail }

// decodeDense decodes one v2 message into the v1 form every client uses.
// The whole message is checked once (json.Valid, or json.Unmarshal); the
// event and item arrays are then split in place, with no copy of each
// element. An events or coalesced message as the server writes it skips
// json.Unmarshal's reflection (denseEvents): most of a stream's messages.
func decodeDense(msg []byte) (Message, error) {
	if m, ok, err := denseEvents(msg); ok {
		return m, err
	}
	return unmarshalDense(msg)
}

// unmarshalDense is decodeDense through json.Unmarshal, for every message.
func unmarshalDense(msg []byte) (Message, error) {
	var d struct {
		Message
		R     uint64          `json:"r"`
		E     json.RawMessage `json:"e"`
		Items json.RawMessage `json:"items"` // shadows Message.Items
	}
	if err := json.Unmarshal(msg, &d); err != nil {
		return Message{}, err
	}
	m := d.Message
	var el [6][]byte
	switch m.T {
	case TEvents, TCoalesced:
		m.Rev = d.R
		return m, decodeDenseEvents(&m, d.E)
	case TSnapshot:
		list, err := splitArray(d.Items, nil)
		if err != nil {
			return Message{}, fmt.Errorf("items: %w", err)
		}
		m.Items = make([]Item, len(list))
		for i, raw := range list {
			if err := decodeDenseItem(raw, &m.Items[i], el[:0]); err != nil {
				return Message{}, fmt.Errorf("item %d: %w", i, err)
			}
		}
	}
	return m, nil
}

// decodeDenseEvents sets m.Events from e, the event array of m, whose
// revision m.Rev is.
func decodeDenseEvents(m *Message, e []byte) error {
	list, err := splitArray(e, nil)
	if err != nil {
		return fmt.Errorf("e: %w", err)
	}
	var el [6][]byte
	m.Events = make([]Event, len(list))
	for i, raw := range list {
		if err := decodeDenseEvent(raw, m.Rev, &m.Events[i], el[:0]); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

// denseEvents decodes msg when it is valid JSON and an object of the keys
// t (events or coalesced), s, r (unsigned integers) and e only, in any
// order, each spelt plainly: what the server writes. ok is false for
// anything else, which json.Unmarshal then decodes (or refuses) in full,
// with the same result (FuzzDenseEvents).
func denseEvents(msg []byte) (m Message, ok bool, err error) {
	b := bytes.TrimSpace(msg)
	if len(b) < 2 || b[0] != '{' || !json.Valid(b) {
		return m, false, nil
	}
	var e []byte
	b = bytes.TrimLeft(b[1:], " \t\r\n")
	for len(b) > 0 && b[0] != '}' {
		n := valueLen(b) // the key: valid JSON says it is a string
		key := b[:n]
		b = bytes.TrimLeft(b[n:], " \t\r\n")
		b = bytes.TrimLeft(b[1:], " \t\r\n") // the colon
		n = valueLen(b)
		v := b[:n]
		switch string(key) {
		case `"t"`:
			if m.T, err = denseString(v); err != nil || m.T != TEvents && m.T != TCoalesced {
				return Message{}, false, nil
			}
		case `"s"`:
			if m.S, ok = leadingDigits(v); !ok {
				return Message{}, false, nil
			}
		case `"r"`:
			if m.Rev, ok = leadingDigits(v); !ok {
				return Message{}, false, nil
			}
		case `"e"`:
			e = v
		default:
			return Message{}, false, nil
		}
		b = bytes.TrimLeft(b[n:], " \t\r\n")
		if b[0] == ',' {
			b = bytes.TrimLeft(b[1:], " \t\r\n")
		}
	}
	if m.T == "" || e == nil || e[0] != '[' {
		return Message{}, false, nil
	}
	return m, true, decodeDenseEvents(&m, e)
}

// denseExtras is the extras object of an event or item.
type denseExtras struct {
	M *uint64         `json:"m"`
	L int             `json:"l"`
	W string          `json:"w"`
	P json.RawMessage `json:"p"`
	X int             `json:"x"`
}

func decodeDenseEvent(raw []byte, rev uint64, e *Event, el [][]byte) error {
	a, err := splitArray(raw, el)
	if err != nil {
		return err
	}
	var x denseExtras
	switch len(a) {
	case 2, 5:
		if err := unmarshalObject(a[len(a)-1], &x); err != nil {
			return err
		}
	case 1, 4:
	default:
		return fmt.Errorf("an event has 1, 2, 4 or 5 elements, not %d", len(a))
	}
	if e.Key, err = denseString(a[0]); err != nil {
		return err
	}
	e.Type, e.ModRev = "delete", rev
	if len(a) >= 4 {
		e.Type = "put"
		if err := denseKV(a[1:4], &e.Value, &e.CreateRev, &e.Version); err != nil {
			return err
		}
	} else if x.X == 1 {
		e.Type = "leave"
	}
	if x.M != nil {
		e.ModRev = *x.M
	}
	e.Lease, e.Wid = x.L == 1, x.W
	if x.P != nil {
		p, err := splitArray(x.P, nil)
		if err != nil || len(p) != 4 && (len(p) != 5 || string(p[4]) != "1") {
			return fmt.Errorf("prev is [value, create_rev, mod_rev, version, 1?], not %s", x.P)
		}
		e.Prev = &Item{Lease: len(p) == 5}
		if err := denseKV(p, &e.Prev.Value, &e.Prev.CreateRev, &e.Prev.ModRev, &e.Prev.Version); err != nil {
			return err
		}
	}
	return nil
}

func decodeDenseItem(raw []byte, it *Item, el [][]byte) error {
	a, err := splitArray(raw, el)
	if err != nil {
		return err
	}
	if len(a) != 5 && len(a) != 6 {
		return fmt.Errorf("an item has 5 or 6 elements, not %d", len(a))
	}
	if it.Key, err = denseString(a[0]); err != nil {
		return err
	}
	if err := denseKV(a[1:5], &it.Value, &it.CreateRev, &it.ModRev, &it.Version); err != nil {
		return err
	}
	if len(a) == 6 {
		var x denseExtras
		if err := unmarshalObject(a[5], &x); err != nil {
			return err
		}
		it.Lease = x.L == 1
	}
	return nil
}

// denseKV decodes [value, n, n…] into v and ns.
func denseKV(a [][]byte, v *Value, ns ...*uint64) error {
	if err := v.UnmarshalJSON(a[0]); err != nil {
		return err
	}
	for i, n := range ns {
		u, ok := leadingDigits(a[i+1])
		if !ok {
			return fmt.Errorf("%s is not an unsigned integer", a[i+1])
		}
		*n = u
	}
	return nil
}

// leadingDigits parses b, which must be digits only, as a uint64.
func leadingDigits(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// denseString decodes a JSON string; one without escapes is taken as it
// is (the frame is valid UTF-8, checked by each).
func denseString(b []byte) (string, error) {
	if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' && !bytes.ContainsAny(b[1:len(b)-1], `\"`) {
		return string(b[1 : len(b)-1]), nil
	}
	var s string
	err := json.Unmarshal(b, &s)
	return s, err
}

// splitArray appends to out the elements of b, a JSON array within text
// json.Unmarshal has checked, without copying them.
func splitArray(b []byte, out [][]byte) ([][]byte, error) {
	b = bytes.TrimSpace(b)
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return nil, fmt.Errorf("want an array, not %.40s", b)
	}
	b = bytes.TrimSpace(b[1 : len(b)-1])
	for len(b) > 0 {
		n := valueLen(b)
		out = append(out, b[:n])
		b = bytes.TrimLeft(b[n:], " \t\r\n")
		if len(b) > 0 {
			if b[0] != ',' {
				return nil, fmt.Errorf("malformed array at %.40s", b)
			}
			b = bytes.TrimLeft(b[1:], " \t\r\n")
		}
	}
	return out, nil
}

// valueLen is the length of the valid JSON value at the start of b.
func valueLen(b []byte) int {
	switch b[0] {
	case '"':
		for i := 1; i < len(b); i++ {
			switch b[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return len(b)
	case '{', '[':
		depth := 0
		for i := 0; i < len(b); i++ {
			switch b[i] {
			case '"':
				i += valueLen(b[i:]) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for i, c := range b {
		switch c {
		case ',', ']', '}', ' ', '\t', '\r', '\n':
			return i
		}
	}
	return len(b)
}

// unmarshalObject decodes the extras, which must be an object (json
// would take null as nothing).
func unmarshalObject(raw []byte, x *denseExtras) error {
	if len(raw) == 0 || raw[0] != '{' {
		return fmt.Errorf("extras must be an object, not %s", raw)
	}
	return json.Unmarshal(raw, x)
}
