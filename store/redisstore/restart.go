package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
)

// A Redis process that comes back without its last acknowledged writes (a
// restart from an AOF under appendfsync everysec, a failover to a replica
// that lagged) leaves every node that had not delivered them unable to
// tell them lost: it would answer their revisions again with other
// content. So each room's meta records the run_id of the process that
// last wrote or checked it (lua/run.lua), and a room first touched by
// another process starts a new epoch before anything of it is answered,
// unless that process keeps every acknowledged write (lossless).
//
// Which process answers is learnt on each new connection (INFO server,
// in OnConnect), never per command: Redis pays nothing per write or read.
// A read compares its meta with the newest process any connection found,
// taken after the reply (a connection is probed before its first command,
// so that is the process that answered, or a newer one: then the room is
// checked for nothing). A write names its process in its arguments, built
// before the round trip picks a connection; so the committers' client
// refuses a connection to a process other than the one the writes in
// flight were built for (errNewProcess: nothing sent; go-redis may dial
// again in the same round trip, and is refused again), and the committer
// builds them again for the newest process found. Newer is by when the
// probe's reply came (the node's monotonic clock): a process answers
// only after its predecessor died, so a late probe of a dead process
// never replaces its successor.

// errNewProcess refuses a write connection to a Redis process other than
// the one the writes in flight were built for.
var errNewProcess = errors.New("store: redis: a new Redis process; the writes are built again for it")

// master is what the node knows of the Redis process behind one master
// (one address of a cluster; the standalone server or Sentinel's master:
// "").
type master struct {
	mu     sync.Mutex
	run    string    // the newest process any connection found; "" until a probe found one
	at     time.Time // when that probe's reply came
	built  string    // the process the writes in flight were built for
	pinged bool      // buildFor probed it
	// How the process that last answered a probe keeps writes: it fsyncs
	// its AOF before each reply; it was a replica (promoted). Per master:
	// the masters of a cluster may each keep them their own way.
	aofAlways, promoted bool
}

// kept records how the process behind p keeps writes, from a probe that
// could not tell which process it reached (INFO refused); nil: that
// command got no answer, and what the last answer said stays.
func (p *master) kept(aofAlways, promoted *bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keptLocked(aofAlways, promoted)
}

func (p *master) keptLocked(aofAlways, promoted *bool) {
	if aofAlways != nil {
		p.aofAlways = *aofAlways
	}
	if promoted != nil {
		p.promoted = *promoted
	}
}

// lossless reports whether the process behind p keeps every write it
// acknowledged (as the last probe it answered found): its AOF is fsynced
// before each reply, or it is a promoted replica and each write waited
// for minReplicas to confirm it. A master restarted from its own AOF
// under everysec is not: its replicas resync from it and lose the tail
// too.
func (p *master) lossless(minReplicas int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.losslessLocked(minReplicas)
}

func (p *master) losslessLocked(minReplicas int) bool {
	return p.aofAlways || minReplicas > 0 && p.promoted
}

// saw records a probe whose reply found run at at, with how it keeps
// writes (aofAlways, promoted; nil: that command got no answer, and what
// the last answer said stays); it returns whether run is the process
// already recorded, and moves to run when it is newer. A late probe of a
// dead process changes nothing, how it kept writes included.
func (p *master) saw(run string, at time.Time, aofAlways, promoted *bool) (same bool, prev string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if run == p.run {
		p.keptLocked(aofAlways, promoted)
		return true, ""
	}
	prev = p.run
	if p.run == "" || at.After(p.at) {
		p.run, p.at = run, at
		p.keptLocked(aofAlways, promoted)
	}
	return false, prev
}

// proc is the newest process found behind a master and whether it keeps
// every acknowledged write (a script argument), read together: both of
// one master, as it was at one moment.
type proc struct{ run, lossless string }

func (p *master) current(minReplicas int) proc {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.procLocked(minReplicas)
}

func (p *master) procLocked(minReplicas int) proc {
	pr := proc{run: p.run, lossless: "0"}
	if p.losslessLocked(minReplicas) {
		pr.lossless = "1"
	}
	return pr
}

func (p *master) builtFor() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.built
}

// build records the newest process as the one the writes about to be
// sent are built for, and returns it with how it keeps writes. first: no
// process is known and build never asked before, so the caller probes one
// (once: INFO may be refused).
func (p *master) build(minReplicas int) (pr proc, first bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	first = p.run == "" && !p.pinged
	p.pinged = true
	p.built = p.run
	return p.procLocked(minReplicas), first
}

// masters holds what the node knows of each master's process.
type masters struct {
	mu sync.Mutex
	m  map[string]*master
}

func (ms *masters) of(key string) *master {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[string]*master{}
	}
	p := ms.m[key]
	if p == nil {
		p = &master{}
		ms.m[key] = p
	}
	return p
}

// infoField is the value of field in a reply of INFO ("" when absent).
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// onConnect returns the OnConnect of a client's connections to master:
// it probes the process, records it for reads, and for the write client
// (writes) refuses a connection to a process its writes were not built
// for. A server that does not answer INFO (an ACL without @dangerous) is
// not told apart: its rooms keep their run, and a loss is caught only by
// the node that delivered it. CONFIG likewise: such a server is taken to
// lose writes.
func (s *Store) onConnect(addr string, writes bool) func(context.Context, *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		var (
			conf       *redis.MapStringStringCmd
			info, repl *redis.StringCmd
		)
		_, _ = cn.Pipelined(ctx, func(p redis.Pipeliner) error {
			conf = p.ConfigGet(ctx, "append*")
			info = p.Info(ctx, "server")
			repl = p.Info(ctx, "replication")
			return nil
		})
		at := time.Now() // after the reply: a process that answered later is newer
		if infoField(info.Val(), "redis_mode") == "sentinel" {
			return nil // go-redis runs OnConnect on its Sentinel connections too
		}
		// Only a process that answered says how it keeps writes: a probe
		// cut short (its connection died, as when Redis is killed) leaves
		// what the last answer said, or a lossless Redis restarting would
		// be taken for a lossy one until the next connection, and the
		// rooms first touched meanwhile would start new epochs for nothing.
		m := s.masters.of(addr)
		var aofAlways, promoted *bool
		if v, err := conf.Result(); answered(err) {
			aofAlways = new(err == nil && v["appendonly"] == "yes" && v["appendfsync"] == "always")
		}
		// A promoted replica keeps its old master's offset as its second.
		if err := repl.Err(); answered(err) {
			promoted = new(err == nil && infoField(repl.Val(), "second_repl_offset") != "-1")
		}
		run := infoField(info.Val(), "run_id")
		if run == "" {
			m.kept(aofAlways, promoted)
			return nil
		}
		if same, prev := m.saw(run, at, aofAlways, promoted); !same && prev != "" {
			s.log.Warn("store: redis: connected to a new Redis process; each room it did not write yet starts a new epoch at its first use, unless it keeps every acknowledged write",
				"master", addr, "run_id", run, "was", prev, "keeps_acknowledged_writes", m.lossless(s.cfg.MinReplicas))
		}
		// Before the first writes are built for this master (a cluster's
		// client also loads its slots over these connections), any.
		if w := m.builtFor(); writes && w != "" && run != w {
			return errNewProcess
		}
		return nil
	}
}

// answered reports whether a probe's command got Redis's answer: a reply,
// or an error reply (CONFIG refused by an ACL: taken to lose writes).
func answered(err error) bool {
	var rerr redis.Error
	return err == nil || errors.As(err, &rerr)
}

// readRun is the newest process found behind the master of room.
func (s *Store) readRun(ctx context.Context, k roomKeys) proc {
	return s.masters.of(s.masterOf(ctx, k.meta)).current(s.cfg.MinReplicas)
}

// buildFor returns the newest process found behind node's master, and
// records it as the one the writes about to be sent are built for: the
// committers' client refuses a connection to any other; and whether it
// keeps every acknowledged write, as a script argument.
func (s *Store) buildFor(ctx context.Context, node *redis.Client) (run, lossless string) {
	addr := ""
	if s.cluster != nil {
		addr = node.Options().Addr
	}
	m := s.masters.of(addr)
	if _, first := m.build(s.cfg.MinReplicas); first {
		// No connection to this master yet (a cluster's): one of the
		// committers' own probes it, and the writes are built for what
		// it found.
		_ = node.Ping(ctx).Err()
	}
	p, _ := m.build(s.cfg.MinReplicas)
	return p.run, p.lossless
}

// masterOf is the key of the master serving key ("" but in a cluster).
func (s *Store) masterOf(ctx context.Context, key string) string {
	if s.cluster == nil {
		return ""
	}
	node, err := s.cluster.MasterForKey(ctx, key)
	if err != nil {
		return "?" // no process known: nothing is compared
	}
	return node.Options().Addr
}

// restartedRoom reports whether meta m was last checked by a Redis
// process other than run, the newest one found behind its master: the
// room goes through lua/restart.lua before anything of it is answered.
func restartedRoom(m meta, run string) bool {
	return m.epoch != "" && run != "" && m.run != run
}

// afterRestart runs lua/restart.lua for room: its new epoch, or the
// current process adopted. The caller reads the room again.
func (s *Store) afterRestart(ctx context.Context, room string, k roomKeys, p proc) error {
	err := restartScript.Run(ctx, s.rc, []string{k.meta, k.log, k.wids}, store.NewEpoch(), p.lossless, p.run).Err()
	if err != nil {
		return fmt.Errorf("store: redis: checking room %q after a Redis restart: %w", room, err)
	}
	return nil
}

// restartedMeta runs lua/restart.lua for room and reads its meta after.
func (s *Store) restartedMeta(ctx context.Context, room string, k roomKeys, p proc) (meta, error) {
	if err := s.afterRestart(ctx, room, k, p); err != nil {
		return meta{}, err
	}
	mv, err := s.rc.HMGet(ctx, k.meta, metaFields...).Result()
	if err != nil {
		return meta{}, fmt.Errorf("store: redis: reading room %q after a Redis restart: %w", room, err)
	}
	return parseMeta(mv), nil
}
