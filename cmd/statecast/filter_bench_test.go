package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
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
//
// The unfiltered subscribers resume at the loaded room's head instead of
// taking 1,000 snapshots of 50,000 games. Every subscriber's final view is
// checked against the room read over HTTP (list ?filter= for the filtered
// ones). With -short (make test's smoke run): 5,000 games, 100
// subscribers, 1 s of writes. Run:
//
//	go test -run '^$' -bench FilteredLobby -benchtime 1x ./cmd/statecast
func BenchmarkFilteredLobby(b *testing.B) {
	cfg := lobbyConfig{games: 50_000, subs: 1000, rate: 1000, writeFor: 5 * time.Second}
	if testing.Short() {
		cfg.games, cfg.subs, cfg.writeFor = 5000, 100, time.Second
	}
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
}

type lobbyConfig struct {
	games, subs, rate int
	writeFor          time.Duration
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
	s, err := dialLobbySub(ctx, node.WS(), probe, nil, nil)
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
			s, err := dialLobbySub(ctx, node.WS(), lobbySubFilter(filtered, i%lobbyFilters), base, from)
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
	res.writes = writeLobby(ctx, b, w, rng, games, cfg)
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
// writes in flight, and returns once every write is acknowledged.
func writeLobby(ctx context.Context, b *testing.B, w *client.Conn, rng *rand.Rand, gs *lobbyGames, cfg lobbyConfig) int {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	sem := make(chan struct{}, 256)
	var failed atomic.Value
	writes, total := 0, int(cfg.writeFor.Seconds()*float64(cfg.rate))
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
		g := gs.g[i].next(rng)
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
	return writes
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

// dialLobbySub opens a WebSocket and subscribes to games/ with filter
// ("" for none), from a snapshot, or resuming at from over base.
func dialLobbySub(ctx context.Context, url, filter string, base *lobbyBase, from *wire.Position) (*lobbySub, error) {
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{wire.SubprotocolJSON}})
	if err != nil {
		return nil, err
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
	s := &lobbySub{ws: ws, base: base, view: make(map[int]uint64), ready: make(chan struct{}),
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

var (
	lobbyT      = []byte(`"t":"`)
	lobbyType   = []byte(`{"type":"`)
	lobbyKey    = []byte(`"key":"games/`)
	lobbyModRev = []byte(`"mod_rev":`)
)

// apply applies a frame's messages (one per line) to the view.
func (s *lobbySub) apply(frame []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for line := range bytes.SplitSeq(frame, []byte{'\n'}) {
		t := lobbyField(line, lobbyT, '"')
		switch string(t) {
		case "connected", "ok", "progress":
		case "synced":
			s.markReady()
		case "snapshot":
			s.base, s.sum = nil, viewSum{}
			clear(s.view)
			for rest := line; ; {
				game, rev, tail, ok := lobbyItem(rest)
				if !ok {
					break
				}
				s.put(game, rev)
				rest = tail
			}
			s.markReady()
		case "events", "coalesced":
			for rest := line; ; {
				i := bytes.Index(rest, lobbyType)
				if i < 0 {
					break
				}
				rest = rest[i+len(lobbyType):]
				put := bytes.HasPrefix(rest, []byte(`put"`))
				game, rev, tail, ok := lobbyItem(rest)
				if !ok {
					return fmt.Errorf("unexpected event in %.300s", line)
				}
				if put {
					s.put(game, rev)
				} else {
					s.remove(game)
				}
				rest = tail
			}
		default:
			return fmt.Errorf("unexpected message %.300s", line)
		}
	}
	s.signal()
	return nil
}

// lobbyItem finds the next game key in b and the mod_rev after it.
func lobbyItem(b []byte) (game int, rev uint64, rest []byte, ok bool) {
	i := bytes.Index(b, lobbyKey)
	if i < 0 {
		return 0, 0, nil, false
	}
	b = b[i+len(lobbyKey):]
	game = gameIndex(b)
	j := bytes.Index(b, lobbyModRev)
	if j < 0 {
		return 0, 0, nil, false
	}
	b = b[j+len(lobbyModRev):]
	rev, _ = strconv.ParseUint(string(lobbyField(b, nil, ',', '}')), 10, 64)
	return game, rev, b, rev > 0
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
