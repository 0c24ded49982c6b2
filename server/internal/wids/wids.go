// Package wids is the form in which the server stores a client's write id:
// behind the scope of its writer (see server/wids.go for why),
//
//	~<scope>~<client id>
//
// scope being 16 base64url characters (96 bits of SHA-256 of the writer).
package wids

import (
	"crypto/sha256"
	"encoding/base64"
)

// scopeBytes is the length of a scope.
const scopeBytes = 16

// Scope is the scope of the writer named who.
func Scope(who string) string {
	sum := sha256.Sum256([]byte(who))
	return base64.RawURLEncoding.EncodeToString(sum[:12])
}

// Stored is client id wid as the store keeps it for scope.
func Stored(scope, wid string) string { return "~" + scope + "~" + wid }

// Own is the client's id in stored when stored is an id of scope; "" for
// another scope's id, or an id stored before scoping.
func Own(stored, scope string) string {
	if s, id, ok := split(stored); ok && s == scope {
		return id
	}
	return ""
}

// Scoped reports whether id has the form of a stored id, which a client's
// own id may not take: it would pass for another scope's.
func Scoped(id string) bool {
	_, _, ok := split(id)
	return ok
}

// Client is the client's id in stored, whoever sent it; stored itself
// when it was stored before scoping.
func Client(stored string) string {
	if _, id, ok := split(stored); ok {
		return id
	}
	return stored
}

func split(stored string) (scope, id string, ok bool) {
	if len(stored) <= scopeBytes+2 || stored[0] != '~' || stored[scopeBytes+1] != '~' {
		return "", "", false
	}
	scope = stored[1 : scopeBytes+1]
	for i := 0; i < len(scope); i++ {
		if c := scope[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "", "", false
		}
	}
	return scope, stored[scopeBytes+2:], true
}
