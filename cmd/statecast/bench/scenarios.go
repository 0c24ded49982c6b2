package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// runFanout runs fanout (one room) and rooms: nRooms rooms of perRoom
// subscribers each, one writer at --rate writes/s in total spread over the
// rooms in turn.
func (e *env) runFanout(ctx context.Context, r *result, nRooms, perRoom int) error {
	cfg := e.cfg
	n := nRooms * perRoom
	if err := checkCapacity(n+8, n+8); err != nil {
		return err
	}
	rooms := []string{cfg.room}
	if nRooms > 1 {
		rooms = make([]string, nRooms)
		for i := range rooms {
			rooms[i] = cfg.room + "-" + strconv.Itoa(i)
		}
	}
	r.Subs, r.Rate, r.Payload = n, cfg.rate, cfg.payload
	if nRooms > 1 {
		r.Rooms = nRooms
	}
	st := newRunState(e.ceiling, cfg.keys)
	st.fullDecode = cfg.fullDecode
	w, err := e.newWriter(ctx, st, rooms)
	if err != nil {
		return err
	}
	defer w.close()
	capacity := int((cfg.warmup+cfg.duration).Seconds()*cfg.rate*1.02) + 64
	st.wlog = &writeLog{times: make([]atomic.Int64, capacity)}

	subs := make([]*subscriber, n)
	for i := range subs {
		s := newSubscriber(i, i/perRoom, cfg.keys)
		if e.ceiling {
			s.lastRev.Store(w.base[0]) // ?since=base: nothing published after it is missed
		}
		subs[i] = s
	}
	defer e.closeSubs(subs)
	e.logf("%s: connecting %d subscribers to %s", r.Target, n, e.base)
	t := time.Now()
	retries, failed, ferr := e.connectAll(ctx, st, subs, func(s *subscriber) string { return rooms[s.room] }, e.ceiling)
	r.DialRetries = retries
	if failed > 0 {
		return fmt.Errorf("%d subscribers could not connect: %v", failed, ferr)
	}
	if err := e.waitReady(ctx, st, int64(n)); err != nil {
		return err
	}
	r.ConnectS = time.Since(t).Seconds()
	e.logf("%s: %d subscribed in %.1fs; writing %g/s for %v + %v warmup", r.Target, n, r.ConnectS, cfg.rate, cfg.duration, cfg.warmup)

	stop := make(chan struct{})
	type paceResult struct {
		skipped int64
		err     error
	}
	paced := make(chan paceResult, 1)
	go func() {
		sk, err := w.pace(ctx, cfg.rate, capacity, stop)
		paced <- paceResult{sk, err}
	}()
	stopWriter := func() paceResult {
		if stop != nil {
			close(stop)
			stop = nil
			return <-paced
		}
		return paceResult{}
	}
	defer stopWriter()
	if err := w.sleep(ctx, cfg.warmup); err != nil {
		return err
	}
	t0 := st.now()
	st.winLo.Store(t0)
	m0, c0, w0, stall0 := sumMsgs(subs), e.sampleCPU(), w.sent.Load(), w.stalled.Load()
	if err := w.sleep(ctx, cfg.duration); err != nil {
		return err
	}
	t1 := st.now()
	st.winHi.Store(t1)
	m1, c1, w1, stall1 := sumMsgs(subs), e.sampleCPU(), w.sent.Load(), w.stalled.Load()
	rss := e.serverRSS()
	r.NodeRSSMBEach = e.nodesRSS()
	pr := stopWriter()
	if pr.err != nil {
		return pr.err
	}
	if err := w.drain(ctx, cfg.timeout); err != nil {
		return err
	}
	win := time.Duration(t1 - t0)
	r.WindowS = win.Seconds()
	r.WritesSkipped = pr.skipped
	r.WriterStallS = time.Duration(stall1 - stall0).Seconds()
	r.WritesPerS = float64(w1-w0) / win.Seconds()
	r.OfferedPerS = r.WritesPerS * float64(perRoom)
	r.Delivered = m1 - m0
	r.DeliveredPerS = float64(r.Delivered) / win.Seconds()
	r.cpuShares(c0, c1, win)
	if c0.server >= 0 && c1.server >= 0 && r.Delivered > 0 {
		r.ServerCPUUsPerMsg = float64((c1.server - c0.server).Microseconds()) / float64(r.Delivered)
	}
	if c0.redis >= 0 && c1.redis >= 0 && w1 > w0 {
		r.RedisUsPerW = float64((c1.redis - c0.redis).Microseconds()) / float64(w1-w0)
	}
	if rss > 0 {
		r.ServerRSSMB = float64(rss) / (1 << 20)
	}

	// The final state: the room (statecast) or the last offset (ceiling).
	finals := make([]uint64, nRooms)
	items := make([][]roomItem, nRooms)
	for i := range rooms {
		if e.ceiling {
			finals[i] = w.position(0)
			continue
		}
		rev, it, err := e.roomState(ctx, rooms[i])
		if err != nil {
			return err
		}
		finals[i], items[i] = rev, it
	}
	r.DrainS = e.drainSubs(ctx, st, subs, finals).Seconds()
	e.closeSubs(subs)

	var h latencyHist
	for _, s := range subs {
		h.Merge(&s.hist)
		r.Coalesced += s.coalesced
		r.Snapshots += s.snapOther
		if s.err != nil {
			r.Disconnected++
			r.addNote("subscriber %d: %v", s.idx, s.err)
		}
		lost := s.gaps
		if last := s.lastRev.Load(); last < finals[s.room] {
			lost += int64(finals[s.room] - last)
		}
		r.LostMsgs += lost
		bad := lost > 0 || s.disorder > 0 || s.err != nil
		if !e.ceiling {
			if d := s.viewDiff(items[s.room]); d != "" {
				bad = true
				r.addNote("subscriber %d: view differs from room %s: %s", s.idx, rooms[s.room], d)
			}
		}
		if bad {
			r.LostSubs++
		}
	}
	r.setLatency(&h)
	return nil
}

// drainSubs waits until every subscriber reached its room's final
// revision, nobody progressed for 2 s, or --drain passed.
func (e *env) drainSubs(ctx context.Context, st *runState, subs []*subscriber, finals []uint64) time.Duration {
	start := time.Now()
	deadline := start.Add(e.cfg.drain)
	lastTotal, lastMove := int64(-1), time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		behind := 0
		for _, s := range subs {
			if s.lastRev.Load() < finals[s.room] {
				behind++
			}
		}
		if behind == 0 {
			break
		}
		if total := sumMsgs(subs); total != lastTotal {
			lastTotal, lastMove = total, time.Now()
		} else if time.Since(lastMove) > 2*time.Second {
			break
		}
		_ = sleepCtx(ctx, 5*time.Millisecond)
	}
	return time.Since(start)
}

// runIdle holds --conns subscribed connections and reads the server's
// RSS before and after.
func (e *env) runIdle(ctx context.Context, r *result) error {
	cfg := e.cfg
	n := cfg.conns
	if err := checkCapacity(n+8, n+8); err != nil {
		return err
	}
	r.Conns = n
	st := newRunState(e.ceiling, cfg.keys)
	st.fullDecode = cfg.fullDecode
	rss0 := e.serverRSS()
	subs := make([]*subscriber, n)
	for i := range subs {
		subs[i] = newSubscriber(i, 0, cfg.keys)
	}
	defer e.closeSubs(subs)
	e.logf("%s: opening %d idle subscribed connections", r.Target, n)
	t := time.Now()
	retries, failed, ferr := e.connectAll(ctx, st, subs, func(*subscriber) string { return cfg.room }, false)
	r.DialRetries = retries
	if failed > 0 {
		return fmt.Errorf("%d of %d connections could not be opened: %v", failed, n, ferr)
	}
	if err := e.waitReady(ctx, st, int64(n)); err != nil {
		return err
	}
	r.ConnectS = time.Since(t).Seconds()
	e.logf("%s: %d connections in %.1fs; holding %v", r.Target, n, r.ConnectS, cfg.hold)
	c0 := e.sampleCPU()
	if err := sleepCtx(ctx, cfg.hold); err != nil {
		return err
	}
	c1 := e.sampleCPU()
	rss1 := e.serverRSS()
	r.WindowS = cfg.hold.Seconds()
	r.cpuShares(c0, c1, cfg.hold)
	if rss0 > 0 && rss1 > 0 {
		r.RSSBeforeMB = float64(rss0) / (1 << 20)
		r.ServerRSSMB = float64(rss1) / (1 << 20)
		r.RSSPerConnKB = float64(rss1-rss0) / float64(n) / 1024
	}
	e.closeSubs(subs)
	for _, s := range subs {
		if s.err != nil {
			r.Disconnected++
			r.addNote("connection %d: %v", s.idx, s.err)
		}
	}
	r.LostSubs = r.Disconnected
	return nil
}

// runResume: a subscriber takes a position, goes away, --events writes
// happen, it comes back at its position; how long until it has them all.
func (e *env) runResume(ctx context.Context, r *result) error {
	cfg := e.cfg
	k := cfg.events
	r.Events = k
	st := newRunState(e.ceiling, cfg.keys)
	st.fullDecode = cfg.fullDecode
	w, err := e.newWriter(ctx, st, []string{cfg.room})
	if err != nil {
		return err
	}
	defer w.close()
	s := newSubscriber(0, 0, cfg.keys)
	one := []*subscriber{s}
	defer e.closeSubs(one)
	room := func(*subscriber) string { return cfg.room }
	var total, fromSub, writeRates []float64
	c0, began := e.sampleCPU(), time.Now()
	for rep := range cfg.repeat {
		// Take a position: statecast by subscribing (snapshot), the
		// ceiling by connecting at the current offset.
		st.ready.Store(0)
		s.readyAt.Store(0)
		if e.ceiling {
			s.lastRev.Store(w.position(0))
			s.wantRev = 0
		}
		if _, failed, ferr := e.connectAll(ctx, st, one, room, e.ceiling); failed > 0 {
			return ferr
		}
		if err := e.waitReady(ctx, st, 1); err != nil {
			return err
		}
		e.closeSubs(one)
		pos := s.lastRev.Load()

		t := time.Now()
		if err := w.burst(ctx, k); err != nil {
			return err
		}
		writeRates = append(writeRates, float64(k)/time.Since(t).Seconds())
		target := w.position(0)
		if target != pos+uint64(k) {
			return fmt.Errorf("the room moved from %d to %d during %d writes: is another client writing?", pos, target, k)
		}

		st.ready.Store(0)
		s.readyAt.Store(0)
		s.wantRev = target
		snaps, gaps := s.snapOther, s.gaps
		t0 := st.now()
		if _, failed, ferr := e.connectAll(ctx, st, one, room, true); failed > 0 {
			return ferr
		}
		if err := e.waitReady(ctx, st, 1); err != nil {
			return err
		}
		done := s.readyAt.Load()
		e.closeSubs(one)
		replayed := s.replayed
		if e.ceiling {
			replayed = int64(s.lastRev.Load() - pos)
		}
		switch {
		case s.err != nil:
			return fmt.Errorf("run %d: %v", rep+1, s.err)
		case s.snapOther > snaps:
			r.ResumeSnapshots++
			r.addNote("run %d: resumed by a snapshot, not a replay", rep+1)
		case replayed != int64(k) || s.gaps > gaps || s.lastRev.Load() != target:
			r.LostMsgs += int64(k) - replayed
			r.addNote("run %d: %d of %d replayed, at %d of %d", rep+1, replayed, k, s.lastRev.Load(), target)
		default:
			r.ResumeComplete++
		}
		total = append(total, float64(done-t0)/1e6)
		fromSub = append(fromSub, float64(done-s.subAt)/1e6)
		e.logf("%s: run %d: %d missed writes back in %.1f ms", r.Target, rep+1, k, total[len(total)-1])
	}
	r.cpuShares(c0, e.sampleCPU(), time.Since(began))
	r.Repeats = cfg.repeat
	r.ResumeMs = total
	r.ResumeMedianMs = median(total)
	r.ResumeMinMs = slices.Min(total)
	r.ResumeMaxMs = slices.Max(total)
	r.ResumeFromSubMs = median(fromSub)
	r.WritesPerS = median(writeRates)
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// runStorm: --conns subscribers synced; every connection drops at once;
// --storm-writes happen; all reconnect at once and resume.
func (e *env) runStorm(ctx context.Context, r *result) error {
	cfg := e.cfg
	n := cfg.conns
	// Reconnecting needs fresh local ports while the dropped ones are in
	// TIME_WAIT.
	if err := checkCapacity(n+8, 2*n+8); err != nil {
		return err
	}
	r.Conns, r.Events = n, cfg.stormWrites
	st := newRunState(e.ceiling, cfg.keys)
	st.fullDecode = cfg.fullDecode
	w, err := e.newWriter(ctx, st, []string{cfg.room})
	if err != nil {
		return err
	}
	defer w.close()
	subs := make([]*subscriber, n)
	for i := range subs {
		s := newSubscriber(i, 0, cfg.keys)
		if e.ceiling {
			s.lastRev.Store(w.position(0))
		}
		subs[i] = s
	}
	defer e.closeSubs(subs)
	room := func(*subscriber) string { return cfg.room }
	e.logf("%s: connecting %d subscribers", r.Target, n)
	t := time.Now()
	retries, failed, ferr := e.connectAll(ctx, st, subs, room, e.ceiling)
	if failed > 0 {
		return fmt.Errorf("%d of %d subscribers could not connect: %v", failed, n, ferr)
	}
	if err := e.waitReady(ctx, st, int64(n)); err != nil {
		return err
	}
	r.ConnectS = time.Since(t).Seconds()
	snaps := make([]int64, n)
	for i, s := range subs {
		snaps[i] = s.snapOther
	}

	e.logf("%s: %d synced in %.1fs; dropping them all", r.Target, n, r.ConnectS)
	e.closeSubs(subs)
	for _, s := range subs {
		if s.err != nil {
			return fmt.Errorf("subscriber %d before the drop: %v", s.idx, s.err)
		}
	}
	if err := w.burst(ctx, cfg.stormWrites); err != nil {
		return err
	}
	final := w.position(0)
	for _, s := range subs {
		s.readyAt.Store(0)
		s.wantRev = final
	}
	st.ready.Store(0)
	c0 := e.sampleCPU()
	t0 := st.now()
	e.logf("%s: %d writes done; reconnecting %d", r.Target, cfg.stormWrites, n)
	retries2, failed, ferr := e.connectAll(ctx, st, subs, room, true)
	r.DialRetries = retries + retries2
	if failed > 0 {
		r.addNote("%d could not reconnect: %v", failed, ferr)
	}
	werr := e.waitReady(ctx, st, int64(n-failed))
	c1 := e.sampleCPU()
	r.cpuShares(c0, c1, time.Duration(st.now()-t0))
	var items []roomItem
	if !e.ceiling {
		if _, items, err = e.roomState(ctx, cfg.room); err != nil {
			return err
		}
	}
	e.closeSubs(subs)
	if werr != nil {
		r.addNote("%v", werr)
	}
	if c0.server >= 0 && c1.server >= 0 {
		r.ServerCPUS = (c1.server - c0.server).Seconds()
	}
	var h latencyHist
	var lastReady int64
	for i, s := range subs {
		at := s.readyAt.Load()
		ok := at > 0 && s.err == nil && s.lastRev.Load() == final && s.gaps == 0 && s.disorder == 0
		if !e.ceiling && ok {
			if d := s.viewDiff(items); d != "" {
				ok = false
				r.addNote("subscriber %d: view differs from the room: %s", i, d)
			}
		}
		if s.err != nil {
			r.addNote("subscriber %d: %v", i, s.err)
		}
		if !ok {
			r.LostSubs++
			continue
		}
		if s.snapOther > snaps[i] {
			r.StormSnapshot++
		} else {
			r.StormReplayed++
		}
		h.Record(time.Duration(at - t0))
		lastReady = max(lastReady, at)
	}
	// With subscribers lost this is when the last of the others was back.
	r.StormAllS = float64(lastReady-t0) / 1e9
	r.StormP50Ms = float64(h.Quantile(0.50)) / 1e6
	r.StormP99Ms = float64(h.Quantile(0.99)) / 1e6
	return nil
}

// runWrites: --events writes as fast as --writers connections with up to
// --window in flight allow — the node's write throughput and latency (send
// to reply), and with --redis-pid the Redis server's CPU per write. With
// --rooms the writes go to ROOM-0…ROOM-<N-1> in turn, with --write-url to
// several nodes.
func (e *env) runWrites(ctx context.Context, r *result) error {
	if e.ceiling {
		return errors.New("bench: the ceiling takes no writes of its own: run writes against statecast")
	}
	cfg := e.cfg
	rooms := []string{cfg.room}
	if cfg.roomsSet {
		rooms = make([]string, cfg.rooms)
		for i := range rooms {
			rooms[i] = cfg.room + "-" + strconv.Itoa(i)
		}
		r.Rooms = cfg.rooms
	}
	st := newRunState(false, cfg.keys)
	st.wlog = &writeLog{times: make([]atomic.Int64, cfg.events)}
	w, err := e.newWriter(ctx, st, rooms)
	if err != nil {
		return err
	}
	defer w.close()
	e.logf("%s: %d writes over %d connections, %d in flight at most", r.Target, cfg.events, cfg.writers, cfg.window)
	c0, t := e.sampleCPU(), time.Now()
	if err := w.burst(ctx, cfg.events); err != nil {
		return err
	}
	win := time.Since(t)
	c1 := e.sampleCPU()
	r.Events, r.Subs = cfg.events, cfg.writers
	r.WindowS = win.Seconds()
	r.WritesPerS = float64(cfg.events) / win.Seconds()
	var lat latencyHist
	for _, wc := range w.conns {
		lat.Merge(&wc.lat)
	}
	r.AckP50Ms = float64(lat.Quantile(0.50)) / 1e6
	r.AckP99Ms = float64(lat.Quantile(0.99)) / 1e6
	r.cpuShares(c0, c1, win)
	if c0.server >= 0 && c1.server >= 0 {
		r.ServerCPUUsPerMsg = float64((c1.server - c0.server).Microseconds()) / float64(cfg.events)
	}
	if c0.redis >= 0 && c1.redis >= 0 {
		r.RedisUsPerW = float64((c1.redis - c0.redis).Microseconds()) / float64(cfg.events)
	}
	return nil
}
