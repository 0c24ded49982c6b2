package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/statecast/statecast/server/hooks"
)

// LobbyHookRooms are the rooms the lobby's backend validates: the demo's
// own (lobby.html uses lobby:demo unless ?room= says otherwise), so that
// an application's lobby:* rooms are never sent to the demo.
const LobbyHookRooms = "lobby:demo*"

// LobbyHooks is the lobby's application backend, as an application would
// write it: the validation hook (docs/HOOKS.md) that lets only a game's
// host close or change it. A game is a key games/<id> whose value names
// its host's WebSocket session ("hostSession"); a write to it from
// another session is refused with a message the page shows. Games
// without a hostSession (written by hand, e.g. with the CLI) are anyone's.
// statecast serve runs it on a loopback port of its own (--demo-hooks).
type LobbyHooks struct {
	Secret []byte
	// Read returns key's value and mod_rev in room (0 when it does not
	// exist): the backend's view of the state it judges. A backend of its
	// own would GET /v1/rooms/{room}/kv/{key}; this one runs in the node.
	Read func(ctx context.Context, room, key string) (json.RawMessage, uint64, error)
}

// game is the part of a game's value the backend looks at.
type game struct {
	Name        string `json:"name"`
	Host        string `json:"host"`
	HostSession string `json:"hostSession"`
}

// maxRequest bounds a validation request: a transaction's values.
const maxRequest = 16 << 20

func (h *LobbyHooks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequest))
	if err != nil {
		http.Error(w, "cannot read the request", http.StatusBadRequest)
		return
	}
	if err := hooks.VerifySignature(h.Secret, r.Header.Get(hooks.SignatureHeader), body, 0, time.Now()); err != nil {
		http.Error(w, "forbidden", http.StatusForbidden) // not from our node
		return
	}
	var req hooks.ValidateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "not a validation request", http.StatusBadRequest)
		return
	}
	verdict, err := h.judge(r.Context(), &req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError) // the write fails unavailable
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(verdict)
}

// judge allows a write unless it closes or changes a game hosted by
// another session, or names another session as a game's host. The node
// commits an allowed write only if the games read here are still at the
// mod_revs it sent, so judging them as they are now is judging what the
// write will change.
func (h *LobbyHooks) judge(ctx context.Context, req *hooks.ValidateRequest) (hooks.Verdict, error) {
	for _, op := range req.Ops {
		kind, _, ok := strings.Cut(op.Key, "/")
		if kind != "games" || !ok {
			continue
		}
		raw, modRev, err := h.Read(ctx, req.Room, op.Key)
		if err != nil {
			return hooks.Verdict{}, err
		}
		var cur game
		if modRev != 0 {
			_ = json.Unmarshal(raw, &cur) // not an object: a game without a host
		}
		if cur.HostSession != "" && cur.HostSession != req.Session {
			verb := "change"
			if op.Type == "delete" {
				verb = "close"
			}
			return refuse(fmt.Sprintf("Only the host, %s, may %s “%s”.", cur.Host, verb, cur.Name)), nil
		}
		if op.Type == "put" {
			var next game
			if json.Unmarshal(op.Value, &next) == nil && next.HostSession != "" && next.HostSession != req.Session {
				return refuse("A game's hostSession must be the session that writes it."), nil
			}
		}
	}
	return hooks.Verdict{Allow: true}, nil
}

func refuse(msg string) hooks.Verdict { return hooks.Verdict{Allow: false, Message: msg} }
