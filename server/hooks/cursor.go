package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/statecast/statecast/store"
)

// InternalRoom is the reserved room (store.ReservedRoomPrefix) that holds
// the webhooks' state, shared by every node of the store:
//
//	room/<room>            a room that matches a hook; written before its first write commits
//	claim/<hook>           the node delivering the hook; its mod_rev is the fence
//	beat/<hook>            rewritten by the claim's holder while it is alive
//	cursor/<hook>/<room>   the last revision the hook's receiver acknowledged
//
// Every write of a claim's holder is conditional on claim/<hook> still
// being at the mod_rev it took it at, so a node that lost its claim
// cannot move a cursor.
const InternalRoom = store.ReservedRoomPrefix + "hooks"

const (
	roomKeyPrefix   = "room/"
	claimKeyPrefix  = "claim/"
	beatKeyPrefix   = "beat/"
	cursorKeyPrefix = "cursor/"
)

func roomKey(room string) string      { return roomKeyPrefix + room }
func claimKey(hook string) string     { return claimKeyPrefix + hook }
func beatKey(hook string) string      { return beatKeyPrefix + hook }
func cursorPrefix(hook string) string { return cursorKeyPrefix + hook + "/" }

// cursor is a position in a room's history: the last revision the
// receiver acknowledged, in its epoch. The zero cursor has delivered
// nothing.
type cursor struct {
	Epoch string `json:"epoch"`
	Rev   uint64 `json:"rev"`
}

// readCursors returns the hook's cursors by room.
func readCursors(ctx context.Context, st store.Store, hook string) (map[string]cursor, error) {
	p := cursorPrefix(hook)
	snap, err := st.Snapshot(ctx, InternalRoom, p)
	if err != nil {
		return nil, err
	}
	out := make(map[string]cursor, len(snap.Items))
	for _, kv := range snap.Items {
		var c cursor
		if json.Unmarshal(kv.Value, &c) == nil {
			out[strings.TrimPrefix(kv.Key, p)] = c
		}
	}
	return out, nil
}

// writeCursor stores c as the hook's cursor of room if the claim is still
// at claimRev; a *store.ConflictError on the claim key means it is not.
func writeCursor(ctx context.Context, st store.Store, hook, room string, claimRev uint64, c cursor) error {
	v, _ := json.Marshal(c)
	_, err := st.Apply(ctx, InternalRoom, store.Write{
		Conds: []store.Cond{{Key: claimKey(hook), ModRev: claimRev}},
		Ops:   []store.Op{{Type: store.OpPut, Key: cursorPrefix(hook) + room, Value: v}},
	})
	return err
}

// register records room in the registry unless it is there already.
func register(ctx context.Context, st store.Store, room string) error {
	_, err := st.Apply(ctx, InternalRoom, store.Write{
		Conds: []store.Cond{{Key: roomKey(room), ModRev: 0}},
		Ops:   []store.Op{{Type: store.OpPut, Key: roomKey(room), Value: []byte("{}")}},
	})
	if errors.Is(err, store.ErrConflict) {
		return nil
	}
	return err
}
