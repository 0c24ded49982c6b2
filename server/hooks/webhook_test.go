package hooks_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/hooks/hookstest"
	"github.com/statecast/statecast/store"
)

var secret = []byte("test-secret")

// receiver starts a recording receiver on loopback.
func receiver(t *testing.T, respond func(*hooks.Delivery) int) (*hookstest.Receiver, string) {
	t.Helper()
	rc := &hookstest.Receiver{Secret: secret, Respond: respond}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	return rc, srv.URL
}

// start runs the webhooks of a node on st until the test ends.
func start(t *testing.T, st store.Store, cfg hooks.Config) *hooks.Webhooks {
	t.Helper()
	cfg.Secret = secret
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 20*time.Millisecond
	}
	if cfg.Node == "" {
		cfg.Node = "n1"
	}
	w, err := hooks.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

// write commits a put to room as a node does: registration first.
func write(t *testing.T, st store.Store, w *hooks.Webhooks, room, key, value string) uint64 {
	t.Helper()
	ctx := context.Background()
	if err := w.BeforeApply(ctx, room); err != nil {
		t.Fatal(err)
	}
	res, err := st.Apply(ctx, room, store.Put(key, []byte(value)))
	if err != nil {
		t.Fatal(err)
	}
	return res.Rev
}

func memory(events int) *store.Memory {
	return store.NewMemory(store.MemoryConfig{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: events}}})
}

func TestWebhookDeliversEveryRevisionInOrderPerRoom(t *testing.T) {
	st := memory(0)
	defer st.Close()
	rc, url := receiver(t, nil)
	w := start(t, st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: url}}, MaxEvents: 7})
	var wg sync.WaitGroup
	want := map[string]hookstest.Want{}
	for i := range 4 {
		room := fmt.Sprintf("doc:%d", i)
		want[room] = hookstest.Want{Rev: 50}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				write(t, st, w, room, fmt.Sprintf("k%d", j%5), fmt.Sprint(j))
			}
		}()
	}
	write(t, st, w, "other", "k", "1") // matches no hook
	wg.Wait()
	if err := hookstest.Wait(5*time.Second, func() error { return hookstest.Check(rc.Records(), want) }); err != nil {
		t.Fatal(err)
	}
	for _, r := range rc.Records() {
		if r.Delivery.Room == "other" {
			t.Fatalf("delivered a room the pattern does not match: %+v", r.Delivery)
		}
		if n := len(r.Delivery.Revisions); n > 7 {
			t.Fatalf("a delivery of %d revisions, more than MaxEvents 7", n)
		}
	}
	// The events carry what was written and what it replaced: revision 1
	// created k0 ("0"), revision 6 put "5" over it.
	ev := rc.Records()[0].Delivery.Revisions[0].Events[0]
	if ev.Type != "put" || ev.ModRev != 1 || ev.Version != 1 || ev.Prev != nil {
		t.Fatalf("first event: %+v", ev)
	}
	for _, r := range rc.Records() {
		if d := r.Delivery; d.Room == "doc:0" && d.FromRev <= 6 && d.ToRev >= 6 {
			ev := d.Revisions[6-d.FromRev].Events[0]
			if p := ev.Prev; ev.Key != "k0" || string(ev.Value) != "5" || ev.Version != 2 ||
				p == nil || p.Key != "k0" || string(p.Value) != "0" || p.ModRev != 1 || p.Version != 1 {
				t.Fatalf("revision 6 of doc:0: %+v (prev %+v), want k0=5 over k0=0 of revision 1", ev, ev.Prev)
			}
			return
		}
	}
	t.Fatal("revision 6 of doc:0 was not delivered")
}

func TestWebhookRetriesUntil2xxWithoutLoss(t *testing.T) {
	st := memory(0)
	defer st.Close()
	var calls atomic.Int32
	rc, url := receiver(t, func(*hooks.Delivery) int {
		if calls.Add(1)%3 != 0 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	reg := prometheus.NewRegistry()
	w := start(t, st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: url}}, MaxEvents: 3})
	reg.MustRegister(w)
	for j := range 20 {
		write(t, st, w, "doc:a", "k", fmt.Sprint(j))
	}
	if err := hookstest.Wait(5*time.Second, func() error {
		return hookstest.Check(rc.Records(), map[string]hookstest.Want{"doc:a": {Rev: 20}})
	}); err != nil {
		t.Fatal(err)
	}
	// The counters move once the hook has read the receiver's answer,
	// after the receiver recorded the delivery.
	id := hooks.WebhookID(hooks.Route{Pattern: "doc:*", URL: url})
	if err := hookstest.Wait(5*time.Second, func() error {
		got := gather(t, reg)
		if got["statecast_webhook_revisions_total{hook="+id+"}"] != 20 || got["statecast_webhook_failures_total{hook="+id+"}"] == 0 ||
			got["statecast_webhook_retries_total{hook="+id+"}"] == 0 {
			return fmt.Errorf("hook %s metrics: %v", id, got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// gather reads reg's counters and gauges as name{label=value,...} → value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			name := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[name] = m.GetGauge().GetValue()
			}
		}
	}
	return got
}

// TestWebhookLagAndFailuresInInspectAndMetrics: while the receiver fails,
// the inspector shows the room's lag, its failed attempts and the last
// error, and /metrics the room's lag, the failing room, failures and
// retries; once the receiver answers, the lag is gone from both.
func TestWebhookLagAndFailuresInInspectAndMetrics(t *testing.T) {
	st := memory(0)
	defer st.Close()
	var down atomic.Bool
	down.Store(true)
	_, url := receiver(t, func(*hooks.Delivery) int {
		if down.Load() {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	reg := prometheus.NewRegistry()
	w := start(t, st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: url}}})
	reg.MustRegister(w)
	for j := range 3 {
		write(t, st, w, "doc:a", "k", fmt.Sprint(j))
	}
	id := hooks.WebhookID(hooks.Route{Pattern: "doc:*", URL: url})
	metric := func(name, labels string) float64 { return gather(t, reg)[name+"{hook="+id+labels+"}"] }
	if err := hookstest.Wait(5*time.Second, func() error {
		ih := w.Inspect()[0]
		if len(ih.Rooms) != 1 || ih.LagRevs != 3 || ih.Failures < 2 {
			return fmt.Errorf("inspector: %+v", ih)
		}
		if r := ih.Rooms[0]; r.Room != "doc:a" || r.Cursor != 0 || r.Head != 3 || r.Lag != 3 || r.LagSeconds <= 0 ||
			r.Attempts < 2 || !strings.Contains(r.LastError, "500") {
			return fmt.Errorf("inspector's room: %+v", r)
		}
		if metric("statecast_webhook_room_lag_revisions", ",room=doc:a") != 3 || metric("statecast_webhook_lag_revisions", "") != 3 ||
			metric("statecast_webhook_lag_seconds", "") <= 0 || metric("statecast_webhook_rooms", ",state=failing") != 1 ||
			metric("statecast_webhook_failures_total", "") < 2 || metric("statecast_webhook_retries_total", "") < 2 {
			return fmt.Errorf("metrics: %v", gather(t, reg))
		}
		return nil
	}); err != nil {
		t.Fatalf("receiver failing: %v", err)
	}
	down.Store(false)
	if err := hookstest.Wait(5*time.Second, func() error {
		ih := w.Inspect()[0]
		if r := ih.Rooms[0]; ih.LagRevs != 0 || r.Cursor != 3 || r.Lag != 0 || r.Attempts != 0 || r.LastError != "" {
			return fmt.Errorf("inspector: %+v", ih)
		}
		got := gather(t, reg)
		if _, ok := got["statecast_webhook_room_lag_revisions{hook="+id+",room=doc:a}"]; ok ||
			metric("statecast_webhook_lag_revisions", "") != 0 || metric("statecast_webhook_rooms", ",state=failing") != 0 {
			return fmt.Errorf("metrics: %v", got)
		}
		return nil
	}); err != nil {
		t.Fatalf("receiver answering again: %v", err)
	}
}

func TestWebhookSnapshotWhenHistoryCompactedPastCursor(t *testing.T) {
	st := memory(5) // 5 events of history per room
	defer st.Close()
	var down atomic.Bool
	rc, url := receiver(t, func(*hooks.Delivery) int {
		if down.Load() {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	w := start(t, st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: url}}})
	for j := range 2 {
		write(t, st, w, "doc:a", fmt.Sprintf("k%d", j%4), fmt.Sprint(j))
	}
	if err := hookstest.Wait(5*time.Second, func() error {
		return hookstest.Check(rc.Records(), map[string]hookstest.Want{"doc:a": {Rev: 2}})
	}); err != nil {
		t.Fatal(err)
	}
	// The receiver is down while the history after the cursor (2) goes.
	down.Store(true)
	for j := 2; j < 30; j++ {
		write(t, st, w, "doc:a", fmt.Sprintf("k%d", j%4), fmt.Sprint(j))
	}
	down.Store(false)
	want := map[string]hookstest.Want{"doc:a": {Rev: 30, Snapshots: true}}
	if err := hookstest.Wait(5*time.Second, func() error { return hookstest.Check(rc.Records(), want) }); err != nil {
		t.Fatal(err)
	}
	var snap *hooks.Delivery
	for _, r := range rc.Records() {
		if r.Delivery.Type == hooks.TypeSnapshot && r.Status == http.StatusOK {
			snap = &r.Delivery
		}
	}
	if snap == nil || snap.Reason != hooks.ReasonCompacted || len(snap.Items) != 4 {
		t.Fatalf("want a snapshot (compacted) of the 4 keys, got %+v", snap)
	}
}

func TestWebhookSnapshotWhenANewHookFindsHistoryGone(t *testing.T) {
	st := memory(5)
	defer st.Close()
	ctx := context.Background()
	// Written before the hook existed (registered by an earlier hook).
	for j := range 9 {
		if _, err := st.Apply(ctx, "doc:a", store.Put("k", []byte(fmt.Sprint(j)))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Apply(ctx, hooks.InternalRoom, store.Put("room/doc:a", []byte("{}"))); err != nil {
		t.Fatal(err)
	}
	rc, url := receiver(t, nil)
	start(t, st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: url}}})
	want := map[string]hookstest.Want{"doc:a": {Rev: 9, Snapshots: true}}
	if err := hookstest.Wait(5*time.Second, func() error { return hookstest.Check(rc.Records(), want) }); err != nil {
		t.Fatal(err)
	}
	if d := rc.Records()[0].Delivery; d.Type != hooks.TypeSnapshot || d.Reason != hooks.ReasonInitial {
		t.Fatalf("first delivery %s (%s), want a snapshot (initial): revision 1 is gone", d.Type, d.Reason)
	}
}

func TestWebhookResumesFromTheCursorInTheStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	open := func() *store.File {
		st, err := store.OpenFile(store.FileConfig{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := open()
	rc, url := receiver(t, nil)
	cfg := hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: url}}}
	w := start(t, st, cfg)
	for j := range 10 {
		write(t, st, w, "doc:a", "k", fmt.Sprint(j))
	}
	want := map[string]hookstest.Want{"doc:a": {Rev: 10}}
	if err := hookstest.Wait(5*time.Second, func() error { return hookstest.Check(rc.Records(), want) }); err != nil {
		t.Fatal(err)
	}
	// The receiver's answer reaches the node a moment after the receiver
	// recorded it; then the cursor is written.
	if err := hookstest.Wait(5*time.Second, func() error {
		snap, err := st.Snapshot(context.Background(), hooks.InternalRoom, "cursor/")
		if err != nil || len(snap.Items) != 1 || !strings.Contains(string(snap.Items[0].Value), `"rev":10`) {
			return fmt.Errorf("cursor in the store: %+v, %v", snap.Items, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// Written while no node delivers, by a node that registers nothing
	// (the room is registered already).
	for j := range 5 {
		if _, err := st.Apply(context.Background(), "doc:a", store.Put("k", []byte(fmt.Sprint(j)))); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	st = open()
	defer st.Close()
	before := len(rc.Records())
	start(t, st, cfg)
	want["doc:a"] = hookstest.Want{Rev: 15}
	if err := hookstest.Wait(5*time.Second, func() error { return hookstest.Check(rc.Records(), want) }); err != nil {
		t.Fatal(err)
	}
	if first := rc.Records()[before].Delivery; first.FromRev != 11 {
		t.Fatalf("after the restart the first delivery starts at %d, want 11 (the cursor + 1)", first.FromRev)
	}
}

func TestWebhookClaimTakenOverAndFenced(t *testing.T) {
	st := memory(0)
	defer st.Close()
	rc, url := receiver(t, nil)
	cfg := hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: url}}, Shared: true, ClaimTimeout: 200 * time.Millisecond}
	cfg.Node = "n1"
	w1 := start(t, st, cfg)
	cfg.Node = "n2"
	w2 := start(t, st, cfg)
	for j := range 10 {
		write(t, st, w2, "doc:a", "k", fmt.Sprint(j))
	}
	want := map[string]hookstest.Want{"doc:a": {Rev: 10}}
	if err := hookstest.Wait(5*time.Second, func() error { return hookstest.Check(rc.Records(), want) }); err != nil {
		t.Fatal(err)
	}
	holder := func() string {
		var claimed []string
		for i, w := range []*hooks.Webhooks{w1, w2} {
			if w.Inspect()[0].Claimed {
				claimed = append(claimed, fmt.Sprint("n", i+1))
			}
		}
		return strings.Join(claimed, ",")
	}
	if h := holder(); h != "n1" && h != "n2" {
		t.Fatalf("claimed by %q, want exactly one node", h)
	}
	// The holder stops (as if dead: it renews no more); the other takes
	// over after the claim timeout and delivers what follows.
	first := holder()
	if first == "n1" {
		w1.Close()
	} else {
		w2.Close()
	}
	for j := range 10 {
		write(t, st, map[bool]*hooks.Webhooks{true: w2, false: w1}[first == "n1"], "doc:a", "k", fmt.Sprint(j))
	}
	want["doc:a"] = hookstest.Want{Rev: 20}
	if err := hookstest.Wait(5*time.Second, func() error { return hookstest.Check(rc.Records(), want) }); err != nil {
		t.Fatal(err)
	}
}

func TestWriteCursorFencedByTheClaim(t *testing.T) {
	st := memory(0)
	defer st.Close()
	ctx := context.Background()
	claim := func(modRev uint64) uint64 {
		res, err := st.Apply(ctx, hooks.InternalRoom, store.Write{Conds: []store.Cond{{Key: "claim/h", ModRev: modRev}},
			Ops: []store.Op{{Type: store.OpPut, Key: "claim/h", Value: []byte(`{}`)}}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Rev
	}
	old := claim(0)
	claim(old) // another node takes it over
	err := hooks.WriteCursorForTest(ctx, st, "h", "doc:a", old, 5)
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a cursor write under a lost claim: %v, want a conflict", err)
	}
}

func TestWebhookRefusesBadConfig(t *testing.T) {
	for name, cfg := range map[string]hooks.Config{
		"no secret":      {Hooks: []hooks.Route{{Pattern: "a", URL: "http://x"}}},
		"bad pattern":    {Hooks: []hooks.Route{{Pattern: "a/b", URL: "http://x"}}, Secret: secret},
		"the same twice": {Hooks: []hooks.Route{{Pattern: "a", URL: "http://x"}, {Pattern: "a", URL: "http://x"}}, Secret: secret},
	} {
		if _, err := hooks.New(memory(0), cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestWebhookSnapshotWhenTheRoomStartedANewEpoch(t *testing.T) {
	st := memory(0)
	defer st.Close()
	rc, url := receiver(t, nil)
	spec := hooks.Route{Pattern: "doc:*", URL: url}
	// Cursors left from a previous epoch of the rooms (their state lost
	// since): one behind the new epoch's head, one ahead of it.
	for room, rev := range map[string]int{"doc:behind": 1, "doc:ahead": 50} {
		v := fmt.Sprintf(`{"epoch":"lost","rev":%d}`, rev)
		if _, err := st.Apply(context.Background(), hooks.InternalRoom, store.Put("cursor/"+hooks.WebhookID(spec)+"/"+room, []byte(v))); err != nil {
			t.Fatal(err)
		}
	}
	w := start(t, st, hooks.Config{Hooks: []hooks.Route{spec}})
	for j := range 5 {
		write(t, st, w, "doc:behind", "k", fmt.Sprint(j))
		write(t, st, w, "doc:ahead", "k", fmt.Sprint(j))
	}
	want := map[string]hookstest.Want{"doc:behind": {Rev: 5, Snapshots: true}, "doc:ahead": {Rev: 5, Snapshots: true}}
	if err := hookstest.Wait(5*time.Second, func() error { return hookstest.Check(rc.Records(), want) }); err != nil {
		t.Fatal(err)
	}
	first := map[string]hooks.Delivery{}
	for _, r := range rc.Records() {
		if _, ok := first[r.Delivery.Room]; !ok {
			first[r.Delivery.Room] = r.Delivery
		}
	}
	for room, d := range first {
		if d.Type != hooks.TypeSnapshot || d.Reason != hooks.ReasonEpoch {
			t.Errorf("%s: first delivery %s (%s), want a snapshot for the new epoch", room, d.Type, d.Reason)
		}
	}
}

func TestWebhookSlowRoomDoesNotHoldUpTheOthers(t *testing.T) {
	st := memory(0)
	defer st.Close()
	// doc:slow is never answered (each POST times out); the others are.
	rc, url := receiver(t, func(d *hooks.Delivery) int {
		if d.Room == "doc:slow" {
			return 0
		}
		return http.StatusOK
	})
	w := start(t, st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: url}}, Workers: 2, Timeout: 5 * time.Second})
	write(t, st, w, "doc:slow", "k", "1")
	time.Sleep(50 * time.Millisecond) // its POST holds one of the two workers
	want := map[string]hookstest.Want{}
	began := time.Now()
	for i := range 5 {
		room := fmt.Sprintf("doc:%d", i)
		want[room] = hookstest.Want{Rev: 20}
		for j := range 20 {
			write(t, st, w, room, "k", fmt.Sprint(j))
		}
	}
	var fast []hookstest.Record
	if err := hookstest.Wait(2*time.Second, func() error {
		fast = fast[:0]
		for _, r := range rc.Records() {
			if r.Delivery.Room != "doc:slow" {
				fast = append(fast, r)
			}
		}
		return hookstest.Check(fast, want)
	}); err != nil {
		t.Fatalf("with doc:slow unanswered: %v", err)
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("the other rooms took %v, well under doc:slow's 5 s timeout expected", took)
	}
}

// Only a webhook reply's status counts: a 2xx with a big body is an
// acknowledgement, not a failure to retry forever.
func TestWebhookReplyBodyIgnored(t *testing.T) {
	st := memory(0)
	defer st.Close()
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		_, _ = w.Write(make([]byte, 256<<10))
	}))
	defer srv.Close()
	w := start(t, st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: srv.URL}}})
	write(t, st, w, "doc:a", "k", "1")
	if err := hookstest.Wait(5*time.Second, func() error {
		if ih := w.Inspect()[0]; ih.Delivered != 1 || ih.Failures != 0 {
			return fmt.Errorf("delivered %d, failures %d", ih.Delivered, ih.Failures)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := posts.Load(); n != 1 {
		t.Fatalf("%d POSTs for one revision", n)
	}
}
