package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/statecast/statecast/store"
)

const (
	// maxGrants bounds the grants of one token, and so the cost of
	// CanRead and CanWrite.
	maxGrants = 256
	// maxRoomPattern and maxPrefix bound a grant's patterns before
	// "{sub}" is substituted. Valid room names are at most 128 bytes and
	// keys at most 1024 by default.
	maxRoomPattern = 256
	maxPrefix      = 1024
	// maxMatchInput bounds the room names the glob looks at; anything
	// longer is no valid room name and matches no pattern.
	maxMatchInput = 1024
	// subPlaceholder is replaced by the token's subject.
	subPlaceholder = "{sub}"
)

// Claims is what a verified token allows. The zero value allows nothing.
// A Claims is not modified by its methods, which may be called concurrently.
type Claims struct {
	// Subject is the token's "sub" (empty for anonymous access).
	Subject string
	// Expiry is the token's "exp", which is required.
	Expiry time.Time
	// Grants are the token's permissions, as written in the token: room
	// patterns and prefixes still contain "{sub}".
	Grants []Grant
}

// Access is a set of permissions, as bit flags.
type Access uint8

// The access bits of a [Grant].
const (
	// Read allows listing and watching keys.
	Read Access = 1
	// Write allows writing and deleting keys.
	Write Access = 2
	// ReadWrite is Read and Write.
	ReadWrite = Read | Write
)

// String returns the claim spelling of a: "r", "w", "rw", or "" for none.
func (a Access) String() string {
	switch a & ReadWrite {
	case Read:
		return "r"
	case Write:
		return "w"
	case ReadWrite:
		return "rw"
	}
	return ""
}

// Grant gives Access to the keys under Prefix in the rooms that Room
// matches. The "statecast" token claim that carries grants, and the
// matching rules, are described in the package documentation (doc.go).
type Grant struct {
	// Room is a room-name pattern: a name, or one with '*' matching any run
	// of characters ("lobby:*", "*"). It may contain "{sub}".
	Room string
	// Prefix is the key prefix the grant covers within the room, "" for
	// every key. It is literal and may contain "{sub}" ("presence/{sub}").
	Prefix string
	// Access says what the grant allows.
	Access Access
}

// farFuture is the expiry of anonymous claims.
var farFuture = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// Anonymous returns the claims of an unauthenticated client when a
// deployment runs without auth: no subject, read and write on every key of
// every room, and an expiry in the year 9999.
func Anonymous() *Claims {
	return &Claims{
		Expiry: farFuture,
		Grants: []Grant{{Room: "*", Prefix: "", Access: ReadWrite}},
	}
}

// ExpiresIn returns how long the claims remain valid after now; zero or
// negative once they have expired (a nil Claims has expired).
func (c *Claims) ExpiresIn(now time.Time) time.Duration {
	if c == nil {
		return 0
	}
	return c.Expiry.Sub(now)
}

// CanRead reports whether c allows listing or watching the keys under
// prefix in room: some grant with Read access must match room, and the
// grant's prefix must be a prefix of the requested prefix, so the watch
// cannot see keys outside the grant. Room names are matched as given; the
// caller validates them.
func (c *Claims) CanRead(room, prefix string) bool {
	return c.allows(Read, room, prefix)
}

// CanWrite reports whether c allows writing or deleting key in room: some
// grant with Write access must match room, and key must start with the
// grant's prefix.
func (c *Claims) CanWrite(room, key string) bool {
	return c.allows(Write, room, key)
}

// allows reports whether a grant with need access matches room and covers s
// (a requested prefix or a key).
func (c *Claims) allows(need Access, room, s string) bool {
	if c == nil {
		return false
	}
	for _, g := range c.Grants {
		if g.Access&need != need {
			continue
		}
		prefix, ok := expand(g.Prefix, c.Subject, false)
		if !ok || !strings.HasPrefix(s, prefix) {
			continue
		}
		pattern, ok := expand(g.Room, c.Subject, true)
		if ok && globMatch(pattern, room) {
			return true
		}
	}
	return false
}

// expand substitutes sub for "{sub}" in pattern. It reports false when
// pattern uses "{sub}" and sub is unfit: empty, holding a wildcard or brace,
// or (for a room pattern) not a valid room name; for a prefix, not valid
// UTF-8 or holding a NUL byte (no key can hold those).
func expand(pattern, sub string, room bool) (string, bool) {
	if !strings.Contains(pattern, subPlaceholder) {
		return pattern, true
	}
	if sub == "" || strings.ContainsAny(sub, "*{}") {
		return "", false
	}
	if room {
		if store.ValidRoom(sub) != nil {
			return "", false
		}
	} else if !utf8.ValidString(sub) || strings.IndexByte(sub, 0) >= 0 {
		return "", false
	}
	return strings.ReplaceAll(pattern, subPlaceholder, sub), true
}

// globMatch reports whether s matches pattern, where '*' matches any
// run of bytes (including none) and every other byte matches itself.
//
// The pattern splits at '*' into a head, middle segments and a tail: s must
// start with the head, end with the tail, and hold the middle segments in
// order in between. Taking each middle segment at its leftmost occurrence is
// optimal (it leaves the most room for the rest), so there is no
// backtracking: the cost is at most O(len(s) * len(pattern)) via
// strings.Index, and s is capped at maxMatchInput bytes.
func globMatch(pattern, s string) bool {
	if len(s) > maxMatchInput {
		return false
	}
	head, rest, wild := strings.Cut(pattern, "*")
	if !wild {
		return pattern == s
	}
	if !strings.HasPrefix(s, head) {
		return false
	}
	s = s[len(head):]
	middle, tail := "", rest
	if i := strings.LastIndexByte(rest, '*'); i >= 0 {
		middle, tail = rest[:i], rest[i+1:]
	}
	if !strings.HasSuffix(s, tail) {
		return false
	}
	s = s[:len(s)-len(tail)]
	for middle != "" {
		var seg string
		seg, middle, _ = strings.Cut(middle, "*")
		if seg == "" {
			continue
		}
		i := strings.Index(s, seg)
		if i < 0 {
			return false
		}
		s = s[i+len(seg):]
	}
	return true
}

// wireClaim is the JSON shape of the "statecast" claim.
type wireClaim struct {
	Grants []wireGrant `json:"grants"`
}

// wireGrant is the JSON shape of one grant.
type wireGrant struct {
	Room   string `json:"room"`
	Prefix string `json:"prefix"`
	Access string `json:"access"`
}

// parseGrants decodes and checks the "statecast" claim. Unknown fields
// are errors, so that a misspelt field cannot widen a grant. Messages name
// the grant by index and never quote values.
func parseGrants(raw json.RawMessage) ([]Grant, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	var wc wireClaim
	if err := dec.Decode(&wc); err != nil {
		return nil, fmt.Errorf("not of the form {\"grants\":[{\"room\",\"prefix\",\"access\"}...]}: %v", err)
	}
	if len(wc.Grants) > maxGrants {
		return nil, fmt.Errorf("%d grants exceed the limit of %d", len(wc.Grants), maxGrants)
	}
	grants := make([]Grant, 0, len(wc.Grants))
	for i, w := range wc.Grants {
		g := Grant{Room: w.Room, Prefix: w.Prefix}
		switch w.Access {
		case "r":
			g.Access = Read
		case "w":
			g.Access = Write
		case "rw":
			g.Access = ReadWrite
		default:
			return nil, fmt.Errorf(`grant %d: access must be "r", "w" or "rw"`, i)
		}
		if err := checkRoomPattern(w.Room); err != nil {
			return nil, fmt.Errorf("grant %d: room: %v", i, err)
		}
		if err := checkPrefix(w.Prefix); err != nil {
			return nil, fmt.Errorf("grant %d: prefix: %v", i, err)
		}
		grants = append(grants, g)
	}
	return grants, nil
}

// checkRoomPattern accepts room-name characters, '*' and "{sub}".
func checkRoomPattern(p string) error {
	switch {
	case p == "":
		return errors.New("missing or empty")
	case len(p) > maxRoomPattern:
		return fmt.Errorf("longer than %d bytes", maxRoomPattern)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '.', c == '_', c == ':', c == '-', c == '@', c == '*':
		case c == '{' && strings.HasPrefix(p[i:], subPlaceholder):
			i += len(subPlaceholder) - 1
		default:
			return fmt.Errorf("character %q at byte %d is not allowed (letters, digits, ._:-@, '*' and {sub})", c, i)
		}
	}
	return nil
}

// checkPrefix accepts a literal key prefix that may contain "{sub}".
func checkPrefix(p string) error {
	switch {
	case len(p) > maxPrefix:
		return fmt.Errorf("longer than %d bytes", maxPrefix)
	case !utf8.ValidString(p):
		return errors.New("not valid UTF-8")
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == 0:
			return fmt.Errorf("NUL byte at byte %d", i)
		case c == '*':
			return fmt.Errorf("'*' at byte %d: prefixes are literal, not patterns", i)
		case c == '{' && strings.HasPrefix(p[i:], subPlaceholder):
			i += len(subPlaceholder) - 1
		case c == '{' || c == '}':
			return fmt.Errorf("%q at byte %d: the only placeholder is {sub}", c, i)
		}
	}
	return nil
}

// MatchRoom reports whether room matches pattern, a room-name pattern
// with '*' as its only wildcard, by the rules of a grant's "room" (no
// "{sub}" substitution). Other packages (server/hooks) match their room
// patterns with it, so one pattern means one thing everywhere.
func MatchRoom(pattern, room string) bool { return globMatch(pattern, room) }

// CheckRoomPattern reports whether pattern is a valid room pattern: the
// characters of room names and '*' ("{sub}" is accepted too).
func CheckRoomPattern(pattern string) error { return checkRoomPattern(pattern) }

// ParseGrants decodes grants given as the "statecast" claim of a token
// ({"grants":[{"room","prefix","access"}…]}) by the same rules, for
// grants that come from elsewhere than a token (a connect hook).
func ParseGrants(raw []byte) ([]Grant, error) { return parseGrants(raw) }
