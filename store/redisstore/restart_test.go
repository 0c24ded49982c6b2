package redisstore

import (
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// TestRestartFromCutAOFStartsANewEpoch: Redis (appendfsync everysec) is
// killed and comes back from an AOF cut back by its last two writes, as
// after a machine crash. Node a delivered them; nodes b and c never
// followed the room, so nothing they hold shows the loss. Yet neither
// answers anything of the lost numbering: b's Head and c's snapshot give
// a new epoch at the revision kept, and b's write is the new epoch's
// first, never revision 4 of the old one again with other content.
func TestRestartFromCutAOFStartsANewEpoch(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{AOF: true, Fsync: "everysec"})
	a := openStore(t, srv.URL(), nil)
	const room = "cut"
	fl := followLog(t, a, room)
	for _, v := range []string{"1", "2", "3"} {
		mustApply(t, a, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte(v)}}})
	}
	size, err := srv.AOFSize()
	if err != nil {
		t.Fatal(err)
	}
	lost := mustApply(t, a, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("4")}}})
	mustApply(t, a, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("5")}}})
	fl.wait(t, "revision 5 delivered", 10*time.Second, func(bs []store.Batch) bool { return len(bs) > 0 && bs[len(bs)-1].Rev == 5 })
	srv.Kill()
	if _, err := srv.CutAOF(size); err != nil {
		t.Fatal(err)
	}
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}

	b := openStore(t, srv.URL(), nil)
	epoch, rev, err := b.Head(bg, room)
	if err != nil {
		t.Fatal(err)
	}
	if epoch == lost.Epoch || rev != 3 {
		t.Errorf("Head after the restart: epoch %s rev %d, want a new epoch (not %s) at the revision kept, 3", epoch, rev, lost.Epoch)
	}
	c := openStore(t, srv.URL(), nil)
	if snap := mustSnapshot(t, c, room); snap.Epoch != epoch || snap.Rev != 3 || string(snap.Items[0].Value) != "3" || snap.Oldest != 4 {
		t.Errorf("snapshot after the restart: %+v, want epoch %s at 3 with k=3, nothing to replay", snap, epoch)
	}
	res := mustApply(t, b, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("other")}}})
	if res.Epoch != epoch || res.Rev != 4 {
		t.Errorf("a write after the restart: %s rev %d, want the new epoch %s at 4", res.Epoch, res.Rev, epoch)
	}
	// Node a learns of the new epoch too.
	fl.wait(t, "the new epoch at a", 10*time.Second, func(bs []store.Batch) bool { return bs[len(bs)-1].Epoch == epoch })
}

// TestRestartFromCutAOFWriteFirst: the first thing a new process is asked
// after the cut is a write through a node that never followed the room:
// it commits as the first revision of a new epoch.
func TestRestartFromCutAOFWriteFirst(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{AOF: true, Fsync: "everysec"})
	a := openStore(t, srv.URL(), nil)
	const room = "cutw"
	mustApply(t, a, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("1")}}})
	size, err := srv.AOFSize()
	if err != nil {
		t.Fatal(err)
	}
	lost := mustApply(t, a, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("2")}}})
	b := openStore(t, srv.URL(), nil)
	srv.Kill()
	if _, err := srv.CutAOF(size); err != nil {
		t.Fatal(err)
	}
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	var res store.Result
	for range 20 { // the first try may meet the connection the kill cut
		if res, err = b.Apply(bg, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("other")}}}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if res.Epoch == lost.Epoch || res.Rev != 2 {
		t.Errorf("write after the cut: %s rev %d, want a new epoch (not %s) at 2", res.Epoch, res.Rev, lost.Epoch)
	}
}

// TestRestartLosingNothingKeepsTheEpoch: with appendfsync always a new
// process holds every acknowledged write: rooms keep their epoch and
// adopt it. A room written by a build without the run field adopts the
// process it is first read from.
func TestRestartLosingNothingKeepsTheEpoch(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{AOF: true})
	a := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	res := mustApply(t, a, "keep", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("1")}}})
	mustApply(t, a, "old", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("1")}}})
	if err := raw.HDel(bg, a.keys("old").meta, "run").Err(); err != nil {
		t.Fatal(err)
	}
	before := raw.HGet(bg, a.keys("keep").meta, "run").Val()
	srv.Restart(t)
	b := openStore(t, srv.URL(), nil)
	for _, room := range []string{"keep", "old"} {
		epoch, rev, err := b.Head(bg, room)
		if err != nil {
			t.Fatal(err)
		}
		if epoch != res.Epoch && room == "keep" || rev != 1 {
			t.Errorf("%s after a restart that lost nothing: %s at %d, want %s at 1", room, epoch, rev, res.Epoch)
		}
		if run := raw.HGet(bg, a.keys(room).meta, "run").Val(); run == "" || run == before {
			t.Errorf("%s: meta's run %q after the restart, want the new process's (was %q)", room, run, before)
		}
	}
}

// TestLateProbeOfADeadProcess: a probe whose reply came before its
// successor's, recorded after it, does not bring the dead process back,
// nor how it kept writes.
func TestLateProbeOfADeadProcess(t *testing.T) {
	var p master
	yes, no := true, false
	old := time.Now()
	if same, _ := p.saw("new", old.Add(time.Millisecond), &no, &no); same {
		t.Fatal("the first process seen was taken for the one recorded")
	}
	if same, prev := p.saw("old", old, &yes, &yes); same || prev != "new" || p.current(1).run != "new" {
		t.Errorf("after a late probe of the dead process: %q (prev %q), want new kept", p.current(1).run, prev)
	}
	if p.lossless(1) {
		t.Error("a late probe of a dead lossless process made its lossy successor lossless")
	}
	if same, _ := p.saw("new", time.Now(), &yes, nil); !same || !p.lossless(0) {
		t.Error("the current process not recognised, or its new answer not kept")
	}
}

// TestProbeCutShortKeepsLossless: a connection probe that Redis never
// answers (its connection died, as when Redis is killed) leaves what the
// last answer said of how it keeps writes; before, a lossless Redis
// restarting was taken for a lossy one until the next probe, and a room
// first touched meanwhile started a new epoch although nothing was lost.
func TestProbeCutShortKeepsLossless(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{AOF: true})
	s := openStore(t, srv.URL(), nil)
	mustApply(t, s, "r", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("1")}}})
	if !s.masters.of("").lossless(0) {
		t.Fatal("appendfsync always not seen as lossless")
	}
	// A server that accepts connections and closes them unanswered.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	dead := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1})
	defer dead.Close()
	cn := dead.Conn()
	defer cn.Close()
	_ = s.onConnect("", false)(bg, cn)
	if !s.masters.of("").lossless(0) {
		t.Error("a probe cut short made the store take Redis for lossy")
	}
}

// TestLosslessPerMaster: how a Redis keeps writes is known per master:
// the masters of a cluster may differ, and a probe of one said how all
// kept them, so a write to a master that loses its tail on a restart
// could be sent as lossless (its rooms then keep their epoch over the
// lost revisions), and one to a lossless master as lossy.
func TestLosslessPerMaster(t *testing.T) {
	always := redistest.Start(t, redistest.Options{AOF: true})
	everysec := redistest.Start(t, redistest.Options{})
	s := openStore(t, always.URL(), nil)
	probe := func(addr string) {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		cn := c.Conn()
		defer cn.Close()
		if err := s.onConnect(addr, false)(bg, cn); err != nil {
			t.Fatal(err)
		}
	}
	probe(always.Addr())
	probe(everysec.Addr())
	if !s.masters.of(always.Addr()).lossless(0) {
		t.Error("the master with appendfsync always is taken for lossy after a probe of another")
	}
	if s.masters.of(everysec.Addr()).lossless(0) {
		t.Error("the master without an AOF is taken for lossless")
	}
	probe(always.Addr())
	if s.masters.of(everysec.Addr()).lossless(0) {
		t.Error("the master without an AOF is taken for lossless after a probe of another")
	}
}
