// Package hooks puts the application's backend in a node's loop over
// HTTP: a validation hook allows or refuses each write to the rooms it is
// configured for before the write commits (validate.go), and a connect
// hook authenticates a client from its own session cookie instead of a
// JWT (connect.go). Webhooks (webhook*.go, cursor.go, claim.go) POST the
// committed revisions of the rooms matching a pattern to the backend, at
// least once and in revision order per room, from cursors kept in the
// store (docs/DESIGN.md#webhooks). Every request a node sends is signed
// with a shared secret (sign.go), so a backend can tell it from a forgery
// or a replay.
// The request and reply JSON, the signature scheme and the error mapping
// are described in docs/HOOKS.md.
package hooks
