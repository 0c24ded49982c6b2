package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The subscribers' hot path: one goroutine per connection reads frames
// into a reused buffer, splits them on '\n' and finds the few fields it
// needs with bytes.Index; nothing is decoded as a whole. It relies only on
// what PROTOCOL.md promises (JSON objects, one per line) and on the field
// names, not on their order.

var (
	fT        = []byte(`"t":"`)
	fTFirst   = []byte(`{"t":"`)
	fRev      = []byte(`"rev":`)
	fID       = []byte(`"id":`)
	fType     = []byte(`"type":"`)
	fKey      = []byte(`"key":`)
	fValue    = []byte(`"value":`)
	fEpoch    = []byte(`"epoch":"`)
	fReason   = []byte(`"reason":"`)
	fItems    = []byte(`"items":`)
	fEvents   = []byte(`"events":`)
	fR        = []byte(`"r":`)
	fE        = []byte(`"e":`)
	fV        = []byte(`"v":`)
	fPingMS   = []byte(`"ping_ms":`)
	fCeilOff  = []byte(`{"o":`)
	fCeilData = []byte(`,"d":`)
	fGap      = []byte(`"gap":`)
)

// leadingUint parses the decimal digits at the start of b.
func leadingUint(b []byte) (uint64, bool) {
	var v uint64
	n := 0
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		v = v*10 + uint64(b[n]-'0')
		n++
	}
	return v, n > 0
}

// fieldUint is the unsigned integer after the first occurrence of name.
func fieldUint(msg, name []byte) (uint64, bool) {
	i := bytes.Index(msg, name)
	if i < 0 {
		return 0, false
	}
	return leadingUint(msg[i+len(name):])
}

// fieldStr is the raw text of the string after the first occurrence of
// name (which ends with the opening quote), escapes left as they are.
func fieldStr(msg, name []byte) []byte {
	i := bytes.Index(msg, name)
	if i < 0 {
		return nil
	}
	b := msg[i+len(name):]
	for j := 0; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return b[:j]
		}
	}
	return nil
}

// skipJSON is the length of the compact JSON value at the start of b.
func skipJSON(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	switch b[0] {
	case '"':
		// The closing quote is the first one not escaped: preceded by an
		// even number of backslashes.
		for j := 1; j < len(b); {
			k := bytes.IndexByte(b[j:], '"')
			if k < 0 {
				return len(b)
			}
			q := j + k
			n := 0
			for n < q-1 && b[q-1-n] == '\\' {
				n++
			}
			if n%2 == 0 {
				return q + 1
			}
			j = q + 1
		}
		return len(b)
	case '{', '[':
		depth := 0
		for j := 0; j < len(b); j++ {
			switch b[j] {
			case '"':
				j += skipJSON(b[j:]) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	}
	for j := 0; j < len(b); j++ {
		switch b[j] {
		case ',', '}', ']', ' ', '\n':
			return j
		}
	}
	return len(b)
}

// keyIndex maps the load tool's keys k0..k<n-1> to their index.
func keyIndex(key []byte, n int) (int, bool) {
	if len(key) < 2 || key[0] != 'k' || len(key) > 8 {
		return 0, false
	}
	v, ok := leadingUint(key[1:])
	if !ok || v >= uint64(n) || len(strconv.FormatUint(v, 10)) != len(key)-1 {
		return 0, false
	}
	return int(v), true
}

// runState is shared by the subscribers and the writer of one run.
type runState struct {
	start   time.Time
	ceiling bool
	keys    int
	wlog    *writeLog    // nil: no latency measured
	winLo   atomic.Int64 // latency is recorded for writes sent in [winLo, winHi)
	winHi   atomic.Int64
	ready   atomic.Int64 // subscribers ready since the last reset
	pingMS  atomic.Int64 // ping_ms of the last connected
	// fullDecode: every message is also decoded whole (--full-decode).
	fullDecode bool
}

func newRunState(ceiling bool, keys int) *runState {
	st := &runState{start: time.Now(), ceiling: ceiling, keys: keys}
	st.winLo.Store(1<<63 - 1)
	st.winHi.Store(1<<63 - 1)
	return st
}

// now is the monotonic time since the run started, in nanoseconds.
func (st *runState) now() int64 { return int64(time.Since(st.start)) }

// writeLog holds the send time of every write by sequence number.
type writeLog struct {
	times []atomic.Int64 // runState.now() at send; 0: not sent
}

// subscriber is one subscribed connection of the load tool, with the
// state that survives reconnects (position, view).
type subscriber struct {
	idx, room int

	// Read by the coordinator while the reader runs.
	msgs    atomic.Int64  // events + coalesced messages (ceiling: messages)
	lastRev atomic.Uint64 // rev (ceiling: offset) of the last message
	readyAt atomic.Int64  // runState.now() at synced or snapshot (ceiling: wantRev reached); 0: not yet
	closing atomic.Bool   // the coordinator is closing the connection

	mu   sync.Mutex
	conn wsConn
	done chan struct{} // closed when the reader ends

	// Owned by the reader; read by the coordinator only after done.
	subAt       int64  // runState.now() when the sub (ceiling: the dial) was sent
	wantRev     uint64 // ceiling: ready once lastRev reaches it
	based       bool   // lastRev is a position: events must follow it without gaps
	epoch       string
	hist        latencyHist
	vals        [][]byte
	has         []bool
	other       map[string][]byte
	events      int64 // events messages
	coalesced   int64
	snapInitial int64
	snapOther   int64 // snapshots with a reason other than initial
	synced      int64
	replayed    int64 // events messages since the last connect
	dense       bool  // the connection speaks protocol v2 (connected's v)
	gaps        int64 // revisions (ceiling: offsets) neither delivered nor covered
	disorder    int64 // messages whose revision went backwards
	err         error // first unexpected thing: err message, unsubscribed, lost connection
}

func newSubscriber(idx, room, keys int) *subscriber {
	return &subscriber{idx: idx, room: room, vals: make([][]byte, keys), has: make([]bool, keys)}
}

func (s *subscriber) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

func (s *subscriber) markReady(st *runState, now int64) {
	if s.readyAt.Load() == 0 {
		s.readyAt.Store(max(now, 1))
		st.ready.Add(1)
	}
}

// read runs the reader of connection c until it fails or is closed.
func (s *subscriber) read(c wsConn, st *runState, done chan struct{}) {
	defer close(done)
	var buf []byte
	for {
		var err error
		buf, err = c.readMessage(buf[:0])
		if err != nil {
			if !s.closing.Load() {
				s.fail(fmt.Errorf("connection lost: %v", err))
			}
			return
		}
		now := st.now()
		var n int64
		frame := buf
		for len(frame) > 0 {
			line := frame
			if i := bytes.IndexByte(frame, '\n'); i >= 0 {
				line, frame = frame[:i], frame[i+1:]
			} else {
				frame = nil
			}
			if len(line) == 0 {
				continue
			}
			if st.fullDecode {
				var v any
				if err := json.Unmarshal(line, &v); err != nil {
					s.fail(fmt.Errorf("message is not JSON: %v", err))
				}
			}
			if st.ceiling {
				n += s.ceilingMessage(line, st, now)
			} else {
				n += s.statecastMessage(line, st, now)
			}
		}
		if n > 0 {
			s.msgs.Add(n)
		}
		if cap(buf) > 1<<20 {
			buf = nil // do not keep a replay's buffer
		}
	}
}

// readFrame appends the rest of one message to buf.
func readFrame(r io.Reader, buf []byte) ([]byte, error) {
	if buf == nil {
		buf = make([]byte, 0, 4096)
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// observe records the latency of a message carrying write seq.
func (st *runState) observe(s *subscriber, seq uint64, now int64) {
	w := st.wlog
	if w == nil || seq >= uint64(len(w.times)) {
		return
	}
	t := w.times[seq].Load()
	if t == 0 || t < st.winLo.Load() || t >= st.winHi.Load() {
		return
	}
	s.hist.Record(time.Duration(now - t))
}

// ceilingMessage handles {"o":N,"d":…} (and {"gap":true}); it returns the
// number of data messages (0 or 1).
func (s *subscriber) ceilingMessage(line []byte, st *runState, now int64) int64 {
	if !bytes.HasPrefix(line, fCeilOff) {
		if bytes.Contains(line, fGap) {
			s.fail(fmt.Errorf("the ceiling no longer retains the requested offsets: %s", line))
		}
		return 0
	}
	o, ok := leadingUint(line[len(fCeilOff):])
	if !ok {
		return 0
	}
	last := s.lastRev.Load()
	switch {
	case o == last+1:
	case o > last:
		s.gaps += int64(o - last - 1)
	default:
		s.disorder++
		return 1
	}
	s.lastRev.Store(o)
	if i := bytes.Index(line, fCeilData); i >= 0 {
		if seq, ok := valueSeq(line[i+len(fCeilData):]); ok {
			st.observe(s, seq, now)
		}
	}
	if s.wantRev > 0 && o >= s.wantRev {
		s.markReady(st, now)
	}
	return 1
}

// messageType is the "t" of a server message.
func messageType(line []byte) []byte {
	if bytes.HasPrefix(line, fTFirst) {
		// The server writes "t" first: skip the search.
		if i := bytes.IndexByte(line[len(fTFirst):], '"'); i >= 0 {
			return line[len(fTFirst) : len(fTFirst)+i]
		}
		return nil
	}
	return fieldStr(line, fT)
}

// statecastMessage handles one server message; it returns 1 for events
// and coalesced messages, 0 for the others.
func (s *subscriber) statecastMessage(line []byte, st *runState, now int64) int64 {
	t := messageType(line)
	switch string(t) {
	case "events", "coalesced":
		rev, _ := fieldUint(line, s.fRev())
		last := s.lastRev.Load()
		if t[0] == 'e' {
			s.events++
			s.replayed++
			if s.based && rev != last+1 {
				if rev > last {
					s.gaps += int64(rev - last - 1)
				} else {
					s.disorder++
				}
			}
		} else {
			s.coalesced++
			if s.based && rev <= last {
				s.disorder++
			}
		}
		apply := s.applyEvents
		if s.dense {
			apply = s.applyDenseEvents
		}
		seq, ok := apply(line)
		s.lastRev.Store(rev)
		s.based = true
		if ok {
			st.observe(s, seq, now)
		}
		return 1
	case "snapshot":
		rev, _ := fieldUint(line, fRev)
		s.epoch = string(fieldStr(line, fEpoch))
		if string(fieldStr(line, fReason)) == "initial" {
			s.snapInitial++
		} else {
			s.snapOther++
		}
		if s.dense {
			s.applyDenseSnapshot(line)
		} else {
			s.applySnapshot(line)
		}
		s.lastRev.Store(rev)
		s.based = true
		s.markReady(st, now)
	case "synced":
		rev, _ := fieldUint(line, fRev)
		s.synced++
		if last := s.lastRev.Load(); rev > last {
			// Everything up to rev was promised: the subscription covers
			// every key, so each revision must have come as events.
			s.gaps += int64(rev - last)
			s.lastRev.Store(rev)
		}
		s.markReady(st, now)
	case "connected":
		v, _ := fieldUint(line, fV)
		s.dense = v == 2
		if ms, ok := fieldUint(line, fPingMS); ok {
			st.pingMS.Store(int64(ms))
		}
	case "err", "unsubscribed":
		s.fail(fmt.Errorf("server: %s", line))
	}
	return 0
}

// setKey applies a put (val non-nil) or a delete of key (raw JSON string
// contents) to the view.
func (s *subscriber) setKey(key, val []byte, put bool) {
	if k, ok := keyIndex(key, len(s.vals)); ok {
		if put {
			s.vals[k] = append(s.vals[k][:0], val...)
		}
		s.has[k] = put
		return
	}
	// A key the load tool does not write: rare, decode it properly.
	var name string
	if json.Unmarshal(append(append([]byte{'"'}, key...), '"'), &name) != nil {
		name = string(key)
	}
	if s.other == nil {
		s.other = make(map[string][]byte)
	}
	if put {
		s.other[name] = bytes.Clone(val)
	} else {
		delete(s.other, name)
	}
}

// applyEvents applies the events of an events or coalesced message. It
// returns the write seq of the last value put (the newest: coalesced
// events are sorted by revision), if the load tool wrote it.
func (s *subscriber) applyEvents(line []byte) (seq uint64, ok bool) {
	i := bytes.Index(line, fEvents)
	if i < 0 {
		return 0, false
	}
	b := line[i+len(fEvents):]
	for {
		i := bytes.Index(b, fType)
		if i < 0 {
			return seq, ok
		}
		b = b[i+len(fType):]
		put := bytes.HasPrefix(b, []byte(`put"`))
		if i = bytes.Index(b, fKey); i < 0 {
			return seq, ok
		}
		b = b[i+len(fKey):]
		n := skipJSON(b)
		if n < 2 {
			return seq, ok
		}
		key := b[1 : n-1]
		b = b[n:]
		if !put {
			s.setKey(key, nil, false)
			continue
		}
		if i = bytes.Index(b, fValue); i < 0 {
			return seq, ok
		}
		b = b[i+len(fValue):]
		n = skipJSON(b)
		s.setKey(key, b[:n], true)
		seq, ok = valueSeq(b[:n])
		b = b[n:]
	}
}

// applySnapshot replaces the view with the items of a snapshot.
func (s *subscriber) applySnapshot(line []byte) {
	clear(s.has)
	s.other = nil
	i := bytes.Index(line, fItems)
	if i < 0 {
		return
	}
	b := line[i+len(fItems):]
	for {
		i := bytes.Index(b, fKey)
		if i < 0 {
			return
		}
		b = b[i+len(fKey):]
		n := skipJSON(b)
		if n < 2 {
			return
		}
		key := b[1 : n-1]
		b = b[n:]
		if i = bytes.Index(b, fValue); i < 0 {
			return
		}
		b = b[i+len(fValue):]
		n = skipJSON(b)
		s.setKey(key, b[:n], true)
		b = b[n:]
	}
}

// fRev is the field of an events message's revision: "r" in protocol v2.
func (s *subscriber) fRev() []byte {
	if s.dense {
		return fR
	}
	return fRev
}

// applyDenseEvents is applyEvents for protocol v2 (PROTOCOL.md §11): each
// event is [key, value, create_rev, version, {extras}?] for a put and
// [key, {extras}?] for a delete or leave.
func (s *subscriber) applyDenseEvents(line []byte) (seq uint64, ok bool) {
	b := denseList(line, fE)
	var el [6][]byte
	for len(b) > 0 && b[0] == '[' {
		var n int
		n, b = denseArray(b, &el)
		if n == 0 || len(el[0]) < 2 {
			return seq, ok
		}
		key := el[0][1 : len(el[0])-1]
		if n >= 4 {
			s.setKey(key, el[1], true)
			seq, ok = valueSeq(el[1])
		} else {
			s.setKey(key, nil, false)
		}
	}
	return seq, ok
}

// applyDenseSnapshot is applySnapshot for protocol v2: each item is
// [key, value, create_rev, mod_rev, version, {extras}?].
func (s *subscriber) applyDenseSnapshot(line []byte) {
	clear(s.has)
	s.other = nil
	b := denseList(line, fItems)
	var el [6][]byte
	for len(b) > 0 && b[0] == '[' {
		var n int
		n, b = denseArray(b, &el)
		if n < 2 || len(el[0]) < 2 {
			return
		}
		s.setKey(el[0][1:len(el[0])-1], el[1], true)
	}
}

// denseList is what follows the '[' of the array after field name in
// line (nil if none): the arrays of a v2 events or snapshot message.
func denseList(line, name []byte) []byte {
	i := bytes.Index(line, name)
	if i < 0 {
		return nil
	}
	b := line[i+len(name):]
	if len(b) == 0 || b[0] != '[' {
		return nil
	}
	return b[1:]
}

// denseArray puts the texts of the first six elements of the compact
// JSON array at the start of b into el; it returns how many elements the
// array has and what follows it (past a comma).
func denseArray(b []byte, el *[6][]byte) (n int, rest []byte) {
	b = b[1:] // '['
	for len(b) > 0 && b[0] != ']' {
		k := skipJSON(b)
		if k == 0 {
			return 0, nil
		}
		if n < len(el) {
			el[n] = b[:k]
		}
		n++
		b = b[k:]
		if len(b) > 0 && b[0] == ',' {
			b = b[1:]
		}
	}
	if len(b) > 0 {
		b = b[1:] // ']'
	}
	if len(b) > 0 && b[0] == ',' {
		b = b[1:]
	}
	return n, b
}

// roomItem is a key of a room as GET /v1/rooms/{room}/kv lists it.
type roomItem struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// viewDiff says how s's view differs from the room's items ("" if not).
func (s *subscriber) viewDiff(items []roomItem) string {
	seen := 0
	for _, it := range items {
		var got []byte
		if k, ok := keyIndex([]byte(it.Key), len(s.vals)); ok {
			if !s.has[k] {
				return fmt.Sprintf("key %q missing", it.Key)
			}
			got = s.vals[k]
		} else {
			v, ok := s.other[it.Key]
			if !ok {
				return fmt.Sprintf("key %q missing", it.Key)
			}
			got = v
		}
		seen++
		if !sameJSON(got, it.Value) {
			return fmt.Sprintf("key %q is %s, the room has %s", it.Key, clip(got), clip(it.Value))
		}
	}
	n := len(s.other)
	for _, h := range s.has {
		if h {
			n++
		}
	}
	if n != seen {
		return fmt.Sprintf("%d keys where the room has %d", n, seen)
	}
	return ""
}

// sameJSON compares two JSON texts: bytewise first, then by value (the
// HTTP API may escape characters the WebSocket leaves as they are).
func sameJSON(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func clip(b []byte) string {
	if len(b) > 40 {
		return string(b[:37]) + "…"
	}
	return string(b)
}

// pinger keeps statecast connections alive: the client must send
// something at least every ping_ms, and the subscribers never write. Each
// connection is pinged when it has been silent for 0.9 × ping_ms, so an
// idle measurement shorter than that sees no pings.
type pinger struct {
	mu    sync.Mutex
	conns map[wsConn]time.Time // when it last wrote
	stop  chan struct{}
	done  chan struct{}
}

func startPinger(every func() time.Duration) *pinger {
	p := &pinger{conns: make(map[wsConn]time.Time), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			due := time.Now().Add(-every() * 9 / 10)
			var list []wsConn
			p.mu.Lock()
			for c, last := range p.conns {
				if last.Before(due) {
					list = append(list, c)
					p.conns[c] = time.Now()
				}
			}
			p.mu.Unlock()
			for _, c := range list {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = c.writeText(ctx, []byte(`{"t":"ping"}`))
				cancel()
				select {
				case <-p.stop:
					return
				default:
				}
			}
		}
	}()
	return p
}

// add registers c, which just wrote.
func (p *pinger) add(c wsConn) {
	p.mu.Lock()
	p.conns[c] = time.Now()
	p.mu.Unlock()
}

func (p *pinger) remove(c wsConn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *pinger) close() {
	close(p.stop)
	<-p.done
}
