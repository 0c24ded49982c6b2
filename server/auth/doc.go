// Package auth verifies the tokens statecast clients present and decides
// what they may read and write. [New] builds an [Authenticator] from a
// [Config] (keys, algorithms, issuer, audience); its [Authenticator.Verify]
// turns a token into [Claims], whose [Claims.CanRead] and [Claims.CanWrite]
// the server asks before every read, watch and write. Without auth
// configured, the server gives every client [Anonymous] claims.
//
// # Tokens
//
// Clients present a JWT (RFC 7519). The server verifies it with the keys and
// algorithms of its [Config]; the "alg" header of a token only selects
// among the algorithms that configuration allows, so "none", an algorithm
// that is not listed and a token signed for another key type (an HS256
// token "signed" with an RSA public key, the classic key-confusion attack)
// are all rejected with [ErrTokenSignature].
//
// A token carries its permissions in a "statecast" claim:
//
//	{"sub": "alice", "exp": 1767225600,
//	 "statecast": {"grants": [
//	   {"room": "lobby:*", "prefix": "",               "access": "r"},
//	   {"room": "lobby:*", "prefix": "presence/{sub}/", "access": "rw"},
//	   {"room": "doc:{sub}",                           "access": "rw"}]}}
//
// The registered claims:
//
//   - "exp" and "sub" are required; a token without either is rejected.
//     The subject owns the sessions and TTL leases it starts and its write
//     rate budget, so tokens without one would share them.
//   - "nbf" and "iat", when present, must not lie in the future.
//   - "exp", "nbf" and "iat" must be JSON numbers (RFC 7519 NumericDate:
//     seconds since 1970, not strings) no later than the year 9999.
//   - "iss" must equal the configured issuer and "aud" must contain the
//     configured audience, when those are configured.
//   - Time checks allow the configured leeway for clock skew (5s by default).
//     A token is valid until "exp" plus the leeway on every surface: HTTP
//     accepts it until then, and a WebSocket session ends (4002) then.
//
// # Grants
//
// Each grant has three fields; any other field is an error, so a misspelt
// "prefix" cannot silently widen a grant to every key:
//
//   - "room" (required): a room-name pattern. '*' matches any run of
//     characters, including none ("lobby:*", "*"); it is the only wildcard,
//     and ':' or '/' have no special meaning. Every other character must be
//     one allowed in room names (letters, digits and "._:-@").
//   - "prefix" (optional, default "" = every key): a key prefix within the
//     room. It is literal: '*' is not a wildcard here and is rejected.
//   - "access" (required): "r" (list and watch), "w" (write and delete) or
//     "rw".
//
// "{sub}" in a room pattern or a prefix is replaced by the token's "sub".
// When the subject is empty or contains '*', '{' or '}' (or, in a room
// pattern, any character not allowed in room names), the grants that use
// "{sub}" match nothing: a strange subject never widens a grant.
//
// A token without a "statecast" claim is valid but grants nothing. A token of
// more than 16 KiB, more than 256 grants, or a grant that breaks the rules
// above is rejected with [ErrTokenClaims] (or [ErrTokenMalformed] for the size).
//
// # Permissions
//
// Permissions use prefix semantics:
//
//   - Writing key K needs a "w" grant whose room pattern matches the room and
//     whose prefix is a prefix of K: "presence/{sub}" lets alice write
//     "presence/alice" and "presence/alice/x", but not "presence/bob".
//   - Listing or watching keys under prefix P needs an "r" grant whose room
//     pattern matches the room and whose prefix is a prefix of P, so the watch
//     can never see a key outside the grant: a "presence/" grant allows
//     watching "presence/" and "presence/alice", but not "" (every key) nor
//     "pres".
//
// Because prefixes are plain string prefixes, "presence/{sub}" given to
// subject "al" also covers "presence/alice". Where one subject can be a
// prefix of another, end the grant with a separator ("presence/{sub}/") and
// keep each subject's keys below it.
//
// # Anonymous access
//
// Anonymous access, when a deployment allows it, is [Anonymous]: read
// and write on every key of every room.
package auth
