package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/cmd/statecast/internal/proc"
	"github.com/statecast/statecast/server/wire"
)

// BenchmarkFilteredLobby is issue 17's acceptance measurement: a
// `statecast serve` process (memory store) holding a lobby of 50,000
// games, 1,000 WebSocket subscribers over 10 distinct filters (100 each),
// each filter selecting about 10 % of the games and of the written
// values, and 1,000 writes/s for 5 s changing random games so that keys
// enter and leave the filters. The same run with 1,000 unfiltered
// subscribers of games/ is the comparison. Reported:
//
//	cpu-µs/write, unfiltered-cpu-µs/write  the server process's CPU per write (its
//	                                        /proc/PID/stat, from the first write until
//	                                        every subscriber holds the final room)
//	B/client, unfiltered-B/client          WebSocket payload bytes each subscriber received
//	x-fewer-bytes                          their ratio: the live stream alone, which is
//	                                        bounded by about 1 / the share of writes the
//	                                        filter selects (entries and leaves add to it)
//	x-fewer-bytes-with-snapshot            the same for a whole list-then-watch: one
//	                                        snapshot, then the stream of the run
//	snapshot-B, snapshot-ms (and unfiltered-…) one subscriber's snapshot on an idle server:
//	                                        its size, and the time from sub to its arrival
//	connect-cpu-ms, connect-s              the server CPU and the wall time to subscribe the
//	                                        1,000 filtered subscribers, snapshots included
//	writes/s, unfiltered-writes/s          the write rate reached (256 writes in flight at most)
//	selected-games-%                       the share of the lobby's games a filter selects at
//	                                        the end of the writes (average of the 10 filters)
//	selected-writes-%                      the share of the writes whose game a filter selects
//	                                        before or after the write (average of the 10): those
//	                                        a correct filtered watch must send
//	bound-x                                100 / selected-writes-%: x-fewer-bytes when a
//	                                        filtered event is as large as an unfiltered one
//
// The last three are the filtered run's writes, counted by the writer.
// The unfiltered subscribers resume at the loaded room's head instead of
// taking 1,000 snapshots of 50,000 games. Every subscriber's final view is
// checked against the room read over HTTP (list ?filter= for the filtered
// ones). With -short (make test's smoke run): 5,000 games, 100
// subscribers, 1 s of writes. The subscribers speak protocol v2
// (statecast.v2.json), or v1 (statecast.v1.json) with LOBBY_PROTOCOL=v1.
// Run:
//
//	go test -run '^$' -bench FilteredLobby -benchtime 1x ./cmd/statecast
func BenchmarkFilteredLobby(b *testing.B) {
	cfg := lobbyConfig{games: 50_000, subs: 1000, rate: 1000, writeFor: 5 * time.Second, proto: lobbyV2}
	if testing.Short() {
		cfg.games, cfg.subs, cfg.writeFor = 5000, 100, time.Second
	}
	switch os.Getenv("LOBBY_PROTOCOL") {
	case "", "v2":
	case "v1":
		cfg.proto = lobbyV1
	default:
		b.Fatalf("LOBBY_PROTOCOL=%s: want v1 or v2", os.Getenv("LOBBY_PROTOCOL"))
	}
	b.Logf("subscribers on %s", cfg.proto.subprotocol)
	statecastBin(b)
	var filtered, unfiltered lobbyResult
	b.StopTimer() // only the writes are timed
	b.ResetTimer()
	for range b.N {
		filtered.add(runLobby(b, cfg, true))
		unfiltered.add(runLobby(b, cfg, false))
	}
	n := float64(b.N)
	b.ReportMetric(filtered.cpuPerWrite()/n, "cpu-µs/write")
	b.ReportMetric(unfiltered.cpuPerWrite()/n, "unfiltered-cpu-µs/write")
	b.ReportMetric(filtered.bytesPerClient/n, "B/client")
	b.ReportMetric(unfiltered.bytesPerClient/n, "unfiltered-B/client")
	b.ReportMetric(unfiltered.bytesPerClient/filtered.bytesPerClient, "x-fewer-bytes")
	b.ReportMetric((unfiltered.snapshotBytes+unfiltered.bytesPerClient)/(filtered.snapshotBytes+filtered.bytesPerClient), "x-fewer-bytes-with-snapshot")
	b.ReportMetric(filtered.snapshotBytes/n, "snapshot-B")
	b.ReportMetric(unfiltered.snapshotBytes/n, "unfiltered-snapshot-B")
	b.ReportMetric(filtered.snapshotTime.Seconds()*1000/n, "snapshot-ms")
	b.ReportMetric(unfiltered.snapshotTime.Seconds()*1000/n, "unfiltered-snapshot-ms")
	b.ReportMetric(filtered.connectCPU.Seconds()*1000/n, "connect-cpu-ms")
	b.ReportMetric(filtered.connectTime.Seconds()/n, "connect-s")
	b.ReportMetric(float64(filtered.writes)/filtered.writeTime.Seconds(), "writes/s")
	b.ReportMetric(float64(unfiltered.writes)/unfiltered.writeTime.Seconds(), "unfiltered-writes/s")
	b.ReportMetric(filtered.selectedGames/n, "selected-games-%")
	b.ReportMetric(filtered.selectedWrites/n, "selected-writes-%")
	b.ReportMetric(100/(filtered.selectedWrites/n), "bound-x")
}

type lobbyConfig struct {
	games, subs, rate int
	writeFor          time.Duration
	proto             lobbyProto
}

// lobbyResult is what one run measured (summed over b.N runs).
type lobbyResult struct {
	writes         int
	writeTime      time.Duration // from the first write to the last one's ack
	writeCPU       time.Duration // server CPU from the first write until every view is final
	bytesPerClient float64
	snapshotBytes  float64
	snapshotTime   time.Duration
	connectCPU     time.Duration
	connectTime    time.Duration
	selectedGames  float64 // %, see BenchmarkFilteredLobby
	selectedWrites float64 // %
}

func (r *lobbyResult) add(o lobbyResult) {
	r.writes += o.writes
	r.writeTime += o.writeTime
	r.writeCPU += o.writeCPU
	r.bytesPerClient += o.bytesPerClient
	r.snapshotBytes += o.snapshotBytes
	r.snapshotTime += o.snapshotTime
	r.connectCPU += o.connectCPU
	r.connectTime += o.connectTime
	r.selectedGames += o.selectedGames
	r.selectedWrites += o.selectedWrites
}

func (r *lobbyResult) cpuPerWrite() float64 {
	return float64(r.writeCPU.Microseconds()) / float64(max(1, r.writes))
}

// The lobby: each game has a mode, a region, and players out of max.
// The 10 filters are the 5 modes × 2 regions of the open games (players <
// max, about 10 in 11 of them): each selects about 9 % of the games.
var (
	lobbyModes   = [...]string{"duel", "team", "ffa", "ranked", "coop"}
	lobbyRegions = [...]string{"eu", "us"}
)

const (
	lobbyRoom    = "lobby-bench"
	lobbyMax     = 10
	lobbyFilters = len(lobbyModes) * len(lobbyRegions)
)

type game struct {
	mode, region, players uint8
	rev                   uint64 // mod_rev, from the write's ack
}

func (g game) value() []byte {
	return fmt.Appendf(nil, `{"mode":%q,"region":%q,"players":%d,"max":%d}`,
		lobbyModes[g.mode], lobbyRegions[g.region], g.players, lobbyMax)
}

func randomGame(rng *rand.Rand) game {
	return game{mode: uint8(rng.IntN(len(lobbyModes))), region: uint8(rng.IntN(len(lobbyRegions))),
		players: uint8(rng.IntN(lobbyMax + 1))}
}

// next is the game after one write: mostly a player joins or leaves
// (the game may fill up or open again), sometimes it ends and a new game
// of any mode and region takes its key.
func (g game) next(rng *rand.Rand) game {
	if rng.IntN(10) == 0 {
		return randomGame(rng)
	}
	switch {
	case g.players == 0:
		g.players++
	case g.players == lobbyMax || rng.IntN(2) == 0:
		g.players--
	default:
		g.players++
	}
	return g
}

// filterSrc is filter f's expression; filterMatch is the same in Go.
func filterSrc(f int) string {
	return fmt.Sprintf(`value.mode == %q && value.region == %q && value.players < value.max`,
		lobbyModes[f/len(lobbyRegions)], lobbyRegions[f%len(lobbyRegions)])
}

func filterMatch(f int, g game) bool {
	return int(g.mode) == f/len(lobbyRegions) && int(g.region) == f%len(lobbyRegions) && g.players < lobbyMax
}

func gameKey(i int) string { return fmt.Sprintf("games/%05d", i) }

// runLobby is one run: a fresh server, the lobby loaded, one subscriber's
// snapshot timed, cfg.subs subscribers (filtered: cfg.subs/10 per filter,
// with a snapshot; unfiltered: resuming at the head), the writes, and the
// check of every view.
func runLobby(b *testing.B, cfg lobbyConfig, filtered bool) lobbyResult {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	node := &mnNode{name: "lobby", redisURL: "memory", extra: []string{"--demo-hooks=false", "--log-level", "error", "--ping-interval", "10m"}}
	node.start(b)
	defer node.kill()
	node.mu.Lock()
	pid := node.cmd.Process.Pid
	node.mu.Unlock()
	cpu := func() time.Duration {
		d, err := proc.CPU(pid)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	h := &client.HTTP{URL: node.HTTP()}
	w, err := client.Dial(ctx, node.WS(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer w.CloseNow()
	rng := rand.New(rand.NewPCG(17, uint64(cfg.games)))
	games := loadLobby(ctx, b, w, rng, cfg.games)
	start, err := h.List(ctx, lobbyRoom, "games/")
	if err != nil {
		b.Fatal(err)
	}
	if len(start.Items) != cfg.games {
		b.Fatalf("the lobby holds %d games, want %d", len(start.Items), cfg.games)
	}
	var res lobbyResult

	// One subscriber's snapshot, on an idle server.
	probe := lobbySubFilter(filtered, 0)
	t0 := time.Now()
	s, err := dialLobbySub(ctx, node.WS(), cfg.proto, probe, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.awaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	res.snapshotTime, res.snapshotBytes = time.Since(t0), float64(s.bytes.Load())
	s.close()

	// The subscribers.
	var base *lobbyBase
	var from *wire.Position
	if !filtered {
		base = newLobbyBase(start.Items)
		from = &wire.Position{Epoch: start.Epoch, Rev: start.Rev + 1}
	}
	subs := make([]*lobbySub, cfg.subs)
	c0, t0 := cpu(), time.Now()
	var wg sync.WaitGroup
	var dialErr atomic.Value
	sem := make(chan struct{}, 64)
	for i := range subs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s, err := dialLobbySub(ctx, node.WS(), cfg.proto, lobbySubFilter(filtered, i%lobbyFilters), base, from)
			if err == nil {
				err = s.awaitReady(ctx)
			}
			if err != nil {
				dialErr.Store(err)
				return
			}
			subs[i] = s
		}()
	}
	wg.Wait()
	if err, _ := dialErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	res.connectCPU, res.connectTime = cpu()-c0, time.Since(t0)
	defer func() {
		for _, s := range subs {
			s.close()
		}
	}()
	for _, s := range subs {
		s.bytes.Store(0)
	}

	// The writes, then the wait for every view to be the final room.
	b.StartTimer()
	c0, t0 = cpu(), time.Now()
	res.writes, res.selectedGames, res.selectedWrites = writeLobby(ctx, b, w, rng, games, cfg)
	res.writeTime = time.Since(t0)
	want := make([]viewSum, lobbyFilters)
	for i, g := range games.g {
		for f := range want {
			if !filtered || filterMatch(f, g) {
				want[f].add(i, g.rev)
			}
		}
	}
	for i, s := range subs {
		if err := s.awaitSum(ctx, want[i%lobbyFilters]); err != nil {
			b.Fatalf("subscriber %d: %v", i, err)
		}
	}
	res.writeCPU = cpu() - c0
	b.StopTimer()
	var total int64
	for _, s := range subs {
		total += s.bytes.Load()
	}
	res.bytesPerClient = float64(total) / float64(len(subs))

	// The views against the room itself.
	for f := range lobbyFilters {
		var o client.ReadOptions
		if filtered {
			o.Filter = filterSrc(f)
		}
		l, err := h.ListWith(ctx, lobbyRoom, "games/", o)
		if err != nil {
			b.Fatal(err)
		}
		for i := f; i < len(subs); i += lobbyFilters {
			if err := subs[i].equals(l.Items); err != nil {
				b.Fatalf("subscriber %d (filter %d): %v", i, f, err)
			}
		}
		if !filtered {
			break
		}
	}
	return res
}

func lobbySubFilter(filtered bool, f int) string {
	if filtered {
		return filterSrc(f)
	}
	return ""
}

// lobbyGames is the writer's copy of the lobby: each game's value and
// mod_rev once its write is acknowledged. A game is written by one
// write at a time, so the copy ends equal to the room.
type lobbyGames struct {
	mu     sync.Mutex
	g      []game
	inWork []bool
}

// loadLobby writes n random games, 250 to a transaction.
func loadLobby(ctx context.Context, b *testing.B, w *client.Conn, rng *rand.Rand, n int) *lobbyGames {
	gs := &lobbyGames{g: make([]game, n), inWork: make([]bool, n)}
	for lo := 0; lo < n; lo += 250 {
		var ops []wire.TxnOp
		for i := lo; i < min(n, lo+250); i++ {
			gs.g[i] = randomGame(rng)
			ops = append(ops, wire.TxnOp{Type: "put", Key: gameKey(i), Value: gs.g[i].value()})
		}
		rev, err := w.Txn(ctx, lobbyRoom, nil, ops)
		if err != nil {
			b.Fatal(err)
		}
		for i := lo; i < min(n, lo+250); i++ {
			gs.g[i].rev = rev
		}
	}
	return gs
}

// writeLobby writes random games at cfg.rate for cfg.writeFor, up to 256
// writes in flight, and returns once every write is acknowledged: the
// writes, then the % of the games a filter selects at the end and the %
// of the writes it selects before or after them (averages of the filters).
func writeLobby(ctx context.Context, b *testing.B, w *client.Conn, rng *rand.Rand, gs *lobbyGames, cfg lobbyConfig) (writes int, selGames, selWrites float64) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	sem := make(chan struct{}, 256)
	var failed atomic.Value
	total := int(cfg.writeFor.Seconds() * float64(cfg.rate))
	selected := 0 // (write, filter) pairs
	start := time.Now()
	for writes < total {
		// The writes due by now: a late tick (a busy machine) is caught up.
		if due := int(time.Since(start).Seconds() * float64(cfg.rate)); writes >= due {
			<-tick.C
			continue
		}
		gs.mu.Lock()
		i := rng.IntN(len(gs.g))
		for gs.inWork[i] {
			i = rng.IntN(len(gs.g))
		}
		g := gs.g[i].next(rng) // gs.g[i] is the room's: no write of i is in flight
		for f := range lobbyFilters {
			if filterMatch(f, gs.g[i]) || filterMatch(f, g) {
				selected++
			}
		}
		gs.inWork[i] = true
		gs.mu.Unlock()
		sem <- struct{}{}
		writes++
		go func() {
			defer func() { <-sem }()
			rev, err := w.Put(ctx, lobbyRoom, gameKey(i), wire.Value(g.value()))
			if err != nil {
				failed.Store(err)
			}
			g.rev = rev
			gs.mu.Lock()
			gs.g[i], gs.inWork[i] = g, false
			gs.mu.Unlock()
		}()
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	matches := 0 // (game, filter) pairs
	for _, g := range gs.g {
		for f := range lobbyFilters {
			if filterMatch(f, g) {
				matches++
			}
		}
	}
	return writes, 100 * float64(matches) / float64(len(gs.g)*lobbyFilters),
		100 * float64(selected) / float64(max(1, writes)*lobbyFilters)
}

// viewSum sums up a view: its keys, and a sum of a hash of each game and
// its mod_rev (which says what value the game holds), so that a
// subscriber's view is compared with the expected one in O(1) while it
// still moves.
type viewSum struct {
	n   int
	sum uint64
}

func (v *viewSum) add(game int, rev uint64)    { v.n++; v.sum += mix(mix(uint64(game)) + rev) }
func (v *viewSum) remove(game int, rev uint64) { v.n--; v.sum -= mix(mix(uint64(game)) + rev) }

// mix is splitmix64's finalizer.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// lobbyBase is the room where the unfiltered subscribers resume, shared
// by them: each game's mod_rev.
type lobbyBase struct {
	rev []uint64
	sum viewSum
}

func newLobbyBase(items []wire.Item) *lobbyBase {
	b := &lobbyBase{rev: make([]uint64, len(items))}
	for _, it := range items {
		i := gameIndex([]byte(it.Key[len("games/"):]))
		b.rev[i] = it.ModRev
		b.sum.add(i, it.ModRev)
	}
	return b
}

// lobbySub is one subscriber on its own WebSocket. Its reader counts the
// payload bytes and keeps the view (each game's mod_rev) with a light
// scan of the JSON, not a decode: 1,000 of them share this process.
type lobbySub struct {
	ws      *websocket.Conn
	scan    lobbyScan
	bytes   atomic.Int64
	ready   chan struct{} // closed at the snapshot, or synced
	changed chan struct{} // signalled when the view changes
	done    chan struct{} // closed when the reader ends
	closing atomic.Bool

	mu      sync.Mutex
	base    *lobbyBase     // nil: the view is a snapshot's
	view    map[int]uint64 // game → mod_rev; over a base, 0 is a game that left
	sum     viewSum
	isReady bool
	err     error
}

// dialLobbySub opens a WebSocket on proto and subscribes to games/ with
// filter ("" for none), from a snapshot, or resuming at from over base.
func dialLobbySub(ctx context.Context, url string, proto lobbyProto, filter string, base *lobbyBase, from *wire.Position) (*lobbySub, error) {
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{proto.subprotocol}})
	if err != nil {
		return nil, err
	}
	if ws.Subprotocol() != proto.subprotocol {
		ws.CloseNow()
		return nil, fmt.Errorf("the server chose subprotocol %q, not %s", ws.Subprotocol(), proto.subprotocol)
	}
	ws.SetReadLimit(-1)
	frame, err := wire.JSON.Append(nil, &wire.Request{T: wire.TConnect})
	if err == nil {
		frame = append(frame, '\n')
		frame, err = wire.JSON.Append(frame, &wire.Request{T: wire.TSub, ID: 1, Room: lobbyRoom,
			Prefixes: []string{"games/"}, Filter: filter, From: from})
	}
	if err == nil {
		err = ws.Write(ctx, websocket.MessageText, frame)
	}
	if err != nil {
		ws.CloseNow()
		return nil, err
	}
	s := &lobbySub{ws: ws, scan: proto.scan, base: base, view: make(map[int]uint64), ready: make(chan struct{}),
		changed: make(chan struct{}, 1), done: make(chan struct{})}
	if base != nil {
		s.sum = base.sum
	}
	go s.read()
	return s, nil
}

func (s *lobbySub) close() {
	if s != nil {
		s.closing.Store(true)
		s.ws.CloseNow()
		<-s.done
	}
}

func (s *lobbySub) read() {
	defer close(s.done)
	var buf bytes.Buffer
	for {
		_, r, err := s.ws.Reader(context.Background())
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(r)
		}
		if err == nil {
			s.bytes.Add(int64(buf.Len()))
			err = s.apply(buf.Bytes())
		}
		if err != nil {
			s.mu.Lock()
			if s.err == nil && !s.closing.Load() {
				s.err = err
			}
			s.mu.Unlock()
			s.signal()
			return
		}
	}
}

func (s *lobbySub) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// lobbyProto is a protocol the subscribers speak, with its scanner.
type lobbyProto struct {
	subprotocol string
	scan        lobbyScan
}

var (
	lobbyV1 = lobbyProto{wire.SubprotocolJSON, scanV1}
	lobbyV2 = lobbyProto{wire.SubprotocolJSON2, scanV2}
)

// lobbyScan finds the next item of a snapshot message, or event of an
// events or coalesced message at revision r, in b (the message from the
// last one on); rest is nil when there is none.
type lobbyScan func(b []byte, r uint64, snapshot bool) (ev lobbyEvent, rest []byte, err error)

// lobbyEvent is what a subscriber keeps of an item or event.
type lobbyEvent struct {
	game int
	rev  uint64 // mod_rev
	put  bool   // false: a leave or delete
}

var (
	lobbyT      = []byte(`"t":"`)
	lobbyR      = []byte(`"r":`)
	lobbyType   = []byte(`{"type":"`)
	lobbyKey    = []byte(`"key":"games/`)
	lobbyModRev = []byte(`"mod_rev":`)
	lobbyKey2   = []byte(`["games/`)
	lobbyM      = []byte(`"m":`)
)

// apply applies a frame's messages (one per line) to the view.
func (s *lobbySub) apply(frame []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for line := range bytes.SplitSeq(frame, []byte{'\n'}) {
		t := string(lobbyField(line, lobbyT, '"'))
		switch t {
		case "connected", "ok", "progress":
		case "synced":
			s.markReady()
		case "snapshot", "events", "coalesced":
			snapshot := t == "snapshot"
			if snapshot {
				s.base, s.sum = nil, viewSum{}
				clear(s.view)
			}
			r, _ := strconv.ParseUint(string(lobbyField(line, lobbyR, ',', '}')), 10, 64) // v2's
			for rest := line; ; {
				ev, tail, err := s.scan(rest, r, snapshot)
				if err != nil {
					return fmt.Errorf("%v in %.300s", err, line)
				}
				if tail == nil {
					break
				}
				if ev.put {
					s.put(ev.game, ev.rev)
				} else {
					s.remove(ev.game)
				}
				rest = tail
			}
			if snapshot {
				s.markReady()
			}
		default:
			return fmt.Errorf("unexpected message %.300s", line)
		}
	}
	s.signal()
	return nil
}

// scanV1 reads v1's objects: {"type":"put","key":"games/…",…,"mod_rev":n,…}
// (an item has no type).
func scanV1(b []byte, _ uint64, snapshot bool) (ev lobbyEvent, rest []byte, err error) {
	ev.put = true
	if !snapshot {
		i := bytes.Index(b, lobbyType)
		if i < 0 {
			return ev, nil, nil
		}
		b = b[i+len(lobbyType):]
		ev.put = bytes.HasPrefix(b, []byte(`put"`))
	}
	i := bytes.Index(b, lobbyKey)
	if i < 0 {
		if snapshot {
			return ev, nil, nil
		}
		return ev, nil, errors.New("an event without a key")
	}
	b = b[i+len(lobbyKey):]
	ev.game = gameIndex(b)
	i = bytes.Index(b, lobbyModRev)
	if i < 0 {
		return ev, nil, errors.New("no mod_rev")
	}
	b = b[i+len(lobbyModRev):]
	ev.rev, err = lobbyRev(lobbyField(b, nil, ',', '}'))
	return ev, b, err
}

// scanV2 reads v2's arrays (PROTOCOL.md §11): an item is [key, value,
// create_rev, mod_rev, version, {extras}?], an event a put [key, value,
// create_rev, version, {extras}?] or a delete or leave [key, {extras}?],
// at mod_rev r unless the extras hold "m". It splits the array at the
// commas outside objects and strings, which holds for the lobby's flat
// values and the extras without "p" (the subscriptions ask for no prev).
func scanV2(b []byte, r uint64, snapshot bool) (ev lobbyEvent, rest []byte, err error) {
	i := bytes.Index(b, lobbyKey2)
	if i < 0 {
		return ev, nil, nil
	}
	b = b[i+1:]
	ev.game = gameIndex(b[len(lobbyKey2)-1:])
	var el [6][]byte
	n, depth, start := 0, 0, 0
	for j := 0; rest == nil; j++ {
		if j == len(b) {
			return ev, nil, errors.New("an unterminated array")
		}
		switch b[j] {
		case '"':
			j += 1 + bytes.IndexByte(b[j+1:], '"')
		case '{':
			depth++
		case '}':
			depth--
		case ',', ']':
			if depth > 0 {
				continue
			}
			if n == len(el) {
				return ev, nil, errors.New("an array of more than 6 elements")
			}
			el[n], n, start = b[start:j], n+1, j+1
			if b[j] == ']' {
				rest = b[j+1:]
			}
		}
	}
	switch {
	case snapshot && (n == 5 || n == 6):
		ev.put = true
		ev.rev, err = lobbyRev(el[3])
	case !snapshot && n <= 5 && n != 3:
		ev.put, ev.rev = n >= 4, r
		if n == 2 || n == 5 {
			if m := lobbyField(el[n-1], lobbyM, ',', '}'); m != nil {
				ev.rev, err = lobbyRev(m)
			}
		}
	default:
		err = fmt.Errorf("an array of %d elements", n)
	}
	return ev, rest, err
}

// lobbyRev parses a revision.
func lobbyRev(b []byte) (uint64, error) {
	rev, err := strconv.ParseUint(string(b), 10, 64)
	if err == nil && rev == 0 {
		err = errors.New("revision 0")
	}
	return rev, err
}

// lobbyField is the text after name up to the first of the end bytes.
func lobbyField(b, name []byte, end ...byte) []byte {
	if name != nil {
		i := bytes.Index(b, name)
		if i < 0 {
			return nil
		}
		b = b[i+len(name):]
	}
	j := bytes.IndexAny(b, string(end))
	if j < 0 {
		return b
	}
	return b[:j]
}

// gameIndex is the number at the start of b (a key after "games/").
func gameIndex(b []byte) int {
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func (s *lobbySub) markReady() {
	if !s.isReady {
		s.isReady = true
		close(s.ready)
	}
}

func (s *lobbySub) lookup(game int) uint64 {
	if rev, ok := s.view[game]; ok || s.base == nil {
		return rev
	}
	return s.base.rev[game]
}

func (s *lobbySub) put(game int, rev uint64) {
	if old := s.lookup(game); old != 0 {
		s.sum.remove(game, old)
	}
	s.view[game] = rev
	s.sum.add(game, rev)
}

func (s *lobbySub) remove(game int) {
	if old := s.lookup(game); old != 0 {
		s.sum.remove(game, old)
	}
	if s.base != nil {
		s.view[game] = 0
	} else {
		delete(s.view, game)
	}
}

func (s *lobbySub) awaitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-s.done:
		return fmt.Errorf("connection lost before the subscription was ready: %v", s.err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitSum waits until the view sums up to want, for at most a minute.
func (s *lobbySub) awaitSum(ctx context.Context, want viewSum) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		s.mu.Lock()
		got, err := s.sum, s.err
		s.mu.Unlock()
		if got == want {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-s.changed:
		case <-ctx.Done():
			return fmt.Errorf("view of %d games, want %d (sums %x, %x)", got.n, want.n, got.sum, want.sum)
		}
	}
}

// equals checks the view against a list of the room.
func (s *lobbySub) equals(items []wire.Item) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sum.n != len(items) {
		return fmt.Errorf("view of %d games, the room %d", s.sum.n, len(items))
	}
	for _, it := range items {
		if got := s.lookup(gameIndex([]byte(it.Key[len("games/"):]))); got != it.ModRev {
			return fmt.Errorf("%s at mod_rev %d, the room at %d", it.Key, got, it.ModRev)
		}
	}
	return nil
}
