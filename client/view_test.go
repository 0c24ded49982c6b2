package client_test

import (
	"testing"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/wire"
)

func put(key string, rev uint64, value string) wire.Event {
	return wire.Event{Type: "put", Key: key, Value: wire.Value(value), CreateRev: 1, ModRev: rev, Version: 1}
}

func del(key string, rev uint64) wire.Event {
	return wire.Event{Type: "delete", Key: key, ModRev: rev}
}

func TestView(t *testing.T) {
	v := client.NewView()
	if v.Position() != nil {
		t.Fatalf("Position of an empty view = %+v, want nil (snapshot)", v.Position())
	}
	steps := []struct {
		m  wire.Message
		ok bool
	}{
		{wire.Message{T: wire.TSnapshot, Epoch: "e", Rev: 5, Items: []wire.Item{{Key: "a", Value: wire.Value(`1`), ModRev: 3}, {Key: "b", Value: wire.Value(`2`), ModRev: 5}}}, true},
		{wire.Message{T: wire.TEvents, Rev: 5, Events: []wire.Event{put("c", 5, `3`)}}, false}, // duplicate revision
		{wire.Message{T: wire.TEvents, Rev: 4, Events: []wire.Event{put("c", 4, `3`)}}, false}, // regression
		{wire.Message{T: wire.TEvents, Rev: 7, Events: []wire.Event{put("c", 6, `3`)}}, false}, // mod_rev of another revision
		{wire.Message{T: wire.TEvents, Rev: 7, Events: []wire.Event{put("c", 7, `3`), del("a", 7)}}, true},
		{wire.Message{T: wire.TProgress, Rev: 9}, true},
		{wire.Message{T: wire.TSynced, Rev: 8}, false},                                              // markers never go back
		{wire.Message{T: wire.TCoalesced, Rev: 12, Events: []wire.Event{put("b", 9, `0`)}}, false},  // covered by progress 9
		{wire.Message{T: wire.TCoalesced, Rev: 12, Events: []wire.Event{put("b", 13, `0`)}}, false}, // beyond its rev
		{wire.Message{T: wire.TCoalesced, Rev: 12, Events: []wire.Event{del("c", 10), put("b", 11, `"x"`)}}, true},
		{wire.Message{T: wire.TUnsubscribed, Code: "unavailable"}, true},
		{wire.Message{T: wire.TSnapshot, Epoch: "e", Rev: 11, Reason: "slow"}, false}, // older than the view
	}
	for i, s := range steps {
		err := v.Apply(s.m)
		if (err == nil) != s.ok {
			t.Fatalf("step %d (%s@%d): err = %v, want ok=%v", i, s.m.T, s.m.Rev, err, s.ok)
		}
	}
	if got := keys(v); len(got) != 1 || got[0] != "b" || string(v.Items["b"].Value) != `"x"` || v.Rev != 12 {
		t.Fatalf("view = %v at %d", v.Items, v.Rev)
	}
	if p := v.Position(); p.Epoch != "e" || p.Rev != 13 {
		t.Fatalf("Position = %+v, want e/13", p)
	}
	// Another epoch: any revision, and everything is replaced.
	if err := v.Apply(wire.Message{T: wire.TSnapshot, Epoch: "f", Rev: 2, Reason: "epoch", Items: []wire.Item{{Key: "z", ModRev: 2}}}); err != nil {
		t.Fatal(err)
	}
	if got := keys(v); len(got) != 1 || got[0] != "z" || v.Epoch != "f" || v.Rev != 2 {
		t.Fatalf("after an epoch snapshot: %v at %s/%d", got, v.Epoch, v.Rev)
	}
}

// TestViewZeroValue: a View{} works without NewView.
func TestViewZeroValue(t *testing.T) {
	var v client.View
	if err := v.Apply(wire.Message{T: wire.TEvents, Rev: 1, Events: []wire.Event{put("a", 1, `1`)}}); err != nil {
		t.Fatal(err)
	}
	if len(v.Items) != 1 || v.Position().Rev != 2 {
		t.Fatalf("view = %+v", v)
	}
}
