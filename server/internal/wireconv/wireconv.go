// Package wireconv converts store events and keys to their protocol form
// (server/wire), for the server's messages and the webhooks' payloads.
package wireconv

import (
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// Events converts store events to their wire form, with each event's
// previous value when prev. With leaves (a filtered watcher's Change),
// deletes are "leave" events: the key left the watcher's result. wid maps
// an event's stored write id to the one its reader may see ("" for
// none); nil shows none.
func Events(evs []store.Event, prev, leaves bool, wid func(stored string) string) []wire.Event {
	out := make([]wire.Event, len(evs))
	for i, ev := range evs {
		e := &out[i]
		e.Key, e.ModRev = ev.KV.Key, ev.KV.ModRev
		if wid != nil && ev.Wid != "" {
			e.Wid = wid(ev.Wid)
		}
		if ev.Type == store.OpPut {
			e.Type, e.Value = "put", wire.Value(ev.KV.Value)
			e.CreateRev, e.Version, e.Lease = ev.KV.CreateRev, ev.KV.Version, ev.KV.Lease != ""
		} else if leaves {
			e.Type = "leave"
		} else {
			e.Type = "delete"
		}
		if prev && ev.Prev != nil {
			p := Item(*ev.Prev)
			p.Key = ""
			e.Prev = &p
		}
	}
	return out
}

// Item converts a key to its wire form.
func Item(kv store.KV) wire.Item {
	return wire.Item{Key: kv.Key, Value: wire.Value(kv.Value), CreateRev: kv.CreateRev,
		ModRev: kv.ModRev, Version: kv.Version, Lease: kv.Lease != ""}
}

// Items converts keys to their wire form.
func Items(kvs []store.KV) []wire.Item {
	out := make([]wire.Item, len(kvs))
	for i, kv := range kvs {
		out[i] = Item(kv)
	}
	return out
}
