package server

import (
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/internal/wids"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// Write ids belong to their writer. A client's id (wid, Idempotency-Key)
// makes its write idempotent, but the store dedupes by id within a room,
// and every writer of a room may send any id: unscoped, one writer's id
// answered another's write as its duplicate, which then never applied.
// So the store keeps a client's id behind its writer's scope
// (server/internal/wids),
//
//	~<scope>~<client id>
//
// scope being 96 bits of SHA-256 of the token's subject, and the store
// remembers each id with a fingerprint of the write (store.FingerprintOf):
// a repeat with other content is refused (wid_reused), never answered as
// the first one's commit. Events carry the stored id; a connection is
// sent the client's id only in the events of its own subject's writes
// (wids.Own), so ids never reach another writer.
//
// Anonymous clients (no auth) have no subject and share one scope: a
// session is not a writer's identity that lasts (a node that crashes
// before writing its record, a grace that passes, an HTTP client), and
// the resend of a write whose session was lost must still find its id.
// They are never sent ids, so none can learn another's, and an id that
// collides all the same (the SDK's have 72 random bits) is refused
// wid_reused, never swallowed. Anonymous clients may write any key anyway.

// widScope is the scope of the ids claims' writer sends.
func widScope(claims *auth.Claims) string {
	if claims != nil && claims.Subject != "" {
		return wids.Scope("sub:" + claims.Subject)
	}
	return wids.Scope("anonymous")
}

// scopeWid puts w's client id behind scope, keeps the client's id as the
// one a build before scoping stored (store.Write.LegacyWid: a retry of a
// write an older node committed), and fingerprints w as the client sent
// it, before anything (the validation hook's conditions) is added.
func scopeWid(w store.Write, scope string) (store.Write, error) {
	if w.Wid == "" {
		return w, nil
	}
	if err := store.ValidWid(w.Wid); err != nil {
		return w, newError(wire.CodeBadRequest, err.Error())
	}
	if wids.Scoped(w.Wid) {
		return w, newError(wire.CodeBadRequest, "a write id of the form ~<16 characters>~<id> is reserved: choose another")
	}
	w.Fingerprint = store.FingerprintOf(w)
	w.LegacyWid = w.Wid
	w.Wid = wids.Stored(scope, w.Wid)
	return w, nil
}
