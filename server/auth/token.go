package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Errors returned by [Authenticator.Verify]. Each is wrapped with detail;
// test for them with errors.Is. No message ever includes the token. Clients
// read these messages in close reasons and HTTP error bodies, so they keep
// the "server:" prefix they had in package server.
var (
	// ErrTokenMissing: the token is the empty string.
	ErrTokenMissing = errors.New("server: no token")
	// ErrTokenMalformed: not a JWT (wrong number of segments, bad base64 or
	// JSON, a claim of the wrong type, an unsupported "crit" header), or
	// larger than 16 KiB.
	ErrTokenMalformed = errors.New("server: malformed token")
	// ErrTokenSignature: the signature does not verify with the configured
	// keys, or the "alg" header is "none", unknown, not allowed by the
	// configuration or meant for a key type that is not configured.
	ErrTokenSignature = errors.New("server: invalid token signature")
	// ErrTokenExpired: "exp" has passed (beyond the leeway).
	ErrTokenExpired = errors.New("server: token expired")
	// ErrTokenNotYetValid: "nbf" or "iat" lies in the future (beyond the
	// leeway).
	ErrTokenNotYetValid = errors.New("server: token not yet valid")
	// ErrTokenClaims: "iss" or "aud" does not match the configuration, "exp"
	// is missing, "exp", "nbf" or "iat" is beyond the year 9999 or before
	// 1970, or the "statecast" permission claim is invalid.
	ErrTokenClaims = errors.New("server: invalid token claims")
)

const (
	// maxTokenBytes bounds the token Verify will look at: longer input is
	// rejected before any decoding.
	maxTokenBytes = 16 << 10
	// maxNumericDate is the last second of the year 9999: a later
	// time claim is not a time this server can represent or compare.
	maxNumericDate = 253402300799
)

// Verify checks token's size, signature and registered claims against the
// configuration and returns its subject, expiry and grants. The error wraps
// one of ErrTokenMissing, ErrTokenMalformed, ErrTokenSignature,
// ErrTokenExpired, ErrTokenNotYetValid or ErrTokenClaims.
func (a *Authenticator) Verify(token string) (*Claims, error) {
	switch {
	case token == "":
		return nil, ErrTokenMissing
	case len(token) > maxTokenBytes:
		return nil, fmt.Errorf("%w: %d bytes exceeds the limit of %d", ErrTokenMalformed, len(token), maxTokenBytes)
	case a == nil || a.parser == nil:
		return nil, fmt.Errorf("%w: no authenticator configured", ErrTokenSignature)
	}
	tc := tokenClaims{Exp: timeClaim{name: "exp"}, Nbf: timeClaim{name: "nbf"}, Iat: timeClaim{name: "iat"}}
	if _, err := a.parser.ParseWithClaims(token, &tc, a.keyfunc); err != nil {
		return nil, classify(err)
	}
	if tc.Exp.t == nil { // WithExpirationRequired makes this unreachable
		return nil, fmt.Errorf("%w: exp claim is required", ErrTokenClaims)
	}
	if tc.Subject == "" {
		// The subject owns sessions, TTL leases and a write budget: tokens
		// without one would all share them.
		return nil, fmt.Errorf("%w: sub claim is required", ErrTokenClaims)
	}
	grants, err := parseGrants(tc.Statecast)
	if err != nil {
		return nil, fmt.Errorf("%w: statecast claim: %v", ErrTokenClaims, err)
	}
	return &Claims{Subject: tc.Subject, Expiry: tc.Exp.t.Time, Grants: grants}, nil
}

// errCrit marks a token with a "crit" header: it names extensions that
// must be understood, and this server understands none (RFC 7515 4.1.11).
var errCrit = errors.New(`"crit" header is not supported`)

// keyfunc hands the parser the keys of the token's (already allowed)
// algorithm, and nothing else.
func (a *Authenticator) keyfunc(t *jwt.Token) (any, error) {
	if _, ok := t.Header["crit"]; ok {
		return nil, errCrit
	}
	set, ok := a.keys[t.Method.Alg()]
	if !ok {
		return nil, errors.New("no key for this algorithm")
	}
	return set, nil
}

// classify maps a jwt error to one of this package's sentinels, keeping
// the library's message (which never quotes the token) as detail.
func classify(err error) error {
	var te *timeClaimError
	if errors.As(err, &te) { // the library's wrapping adds nothing to te
		if te.badType {
			return fmt.Errorf("%w: %v", ErrTokenMalformed, te)
		}
		return fmt.Errorf("%w: %v", ErrTokenClaims, te)
	}
	var sentinel error
	switch {
	case errors.Is(err, errCrit), errors.Is(err, jwt.ErrTokenMalformed):
		sentinel = ErrTokenMalformed
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		sentinel = ErrTokenSignature
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing),
		errors.Is(err, jwt.ErrTokenInvalidIssuer),
		errors.Is(err, jwt.ErrTokenInvalidAudience),
		errors.Is(err, jwt.ErrTokenInvalidSubject),
		errors.Is(err, jwt.ErrInvalidType):
		// Checked before the time claims: a token for another issuer or
		// audience stays wrong after a refresh, an expired one does not.
		sentinel = ErrTokenClaims
	case errors.Is(err, jwt.ErrTokenExpired):
		sentinel = ErrTokenExpired
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		sentinel = ErrTokenNotYetValid
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		sentinel = ErrTokenClaims
	default:
		sentinel = ErrTokenMalformed
	}
	return fmt.Errorf("%w: %v", sentinel, err)
}

// tokenClaims is the JSON shape of a token's payload. Its time claims
// replace RegisteredClaims' (outer fields and methods win), which take a
// number in a string and wrap a huge one into the past.
type tokenClaims struct {
	jwt.RegisteredClaims
	Exp       timeClaim       `json:"exp"`
	Nbf       timeClaim       `json:"nbf"`
	Iat       timeClaim       `json:"iat"`
	Statecast json.RawMessage `json:"statecast"`
}

func (c *tokenClaims) GetExpirationTime() (*jwt.NumericDate, error) { return c.Exp.t, nil }
func (c *tokenClaims) GetNotBefore() (*jwt.NumericDate, error)      { return c.Nbf.t, nil }
func (c *tokenClaims) GetIssuedAt() (*jwt.NumericDate, error)       { return c.Iat.t, nil }

// timeClaim is a strict RFC 7519 NumericDate: a JSON number of seconds
// since 1970, up to the year 9999. name is the claim, for messages.
type timeClaim struct {
	name string
	t    *jwt.NumericDate
}

// timeClaimError is a time claim that is not a NumericDate. badType marks
// a value that is not a number at all (malformed), as opposed to one out
// of range (invalid claims).
type timeClaimError struct {
	msg     string
	badType bool
}

func (e *timeClaimError) Error() string { return e.msg }

func (at *timeClaim) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil // as if absent
	}
	if b[0] != '-' && (b[0] < '0' || b[0] > '9') {
		return &timeClaimError{fmt.Sprintf("%s must be a JSON number of seconds since 1970 (RFC 7519 NumericDate), not a %s", at.name, jsonKind(b[0])), true}
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f < 0 || f > maxNumericDate {
		return &timeClaimError{fmt.Sprintf("invalid %s: %s is not a time between 1970 and the year 9999 in seconds", at.name, b), false}
	}
	sec, frac := math.Modf(f)
	at.t = jwt.NewNumericDate(time.Unix(int64(sec), int64(frac*1e9)))
	return nil
}

// jsonKind names the kind of JSON value that starts with c.
func jsonKind(c byte) string {
	switch c {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "boolean"
}
