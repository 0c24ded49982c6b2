// # Authentication
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
// Anonymous access, when a deployment allows it, is [Anonymous]: read
// and write on every key of every room.
package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"

	"github.com/statecast/statecast/store"
)

// Errors returned by [Authenticator.Verify]. Each is wrapped with detail;
// test for them with errors.Is. No message ever includes the token.
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
	// defaultLeeway is Config.Leeway's default.
	defaultLeeway = 5 * time.Second
	// subPlaceholder is replaced by the token's subject.
	subPlaceholder = "{sub}"
	// maxNumericDate is the last second of the year 9999: a later
	// time claim is not a time this server can represent or compare.
	maxNumericDate = 253402300799
)

// Config says where verification keys and algorithms come from. The
// algorithm is pinned by configuration, never taken from the token: a
// token's "alg" header must be one of Algorithms, and it is checked against
// the keys of the matching type only.
type Config struct {
	// HMACSecret enables HS256, HS384 and HS512 (those listed in Algorithms;
	// HS256 by default). RFC 7518 requires a secret at least as long as the
	// hash: 32 bytes for HS256, 48 for HS384, 64 for HS512.
	HMACSecret []byte
	// PublicKeyPEM holds one or more public keys in PEM: "PUBLIC KEY"
	// (PKIX: RSA, ECDSA or Ed25519), "RSA PUBLIC KEY" (PKCS #1) or
	// "CERTIFICATE" blocks. RSA keys enable RS* and PS* (at least 2048 bits),
	// ECDSA keys ES256, ES384 or ES512 by curve (P-256, P-384, P-521), and
	// Ed25519 keys EdDSA. A token is checked against every key of the type
	// its algorithm needs.
	PublicKeyPEM []byte
	// Algorithms lists the allowed "alg" values. By default: HS256 when
	// HMACSecret is set, plus the natural algorithm of each public key type
	// given (RS256 for RSA, ES256/ES384/ES512 by curve, EdDSA for Ed25519).
	// "none" is never allowed.
	Algorithms []string
	// Issuer, when set, must equal the token's "iss".
	Issuer string
	// Audience, when set, must be one of the token's "aud" values.
	Audience string
	// Leeway is the clock skew allowed on "exp", "nbf" and "iat". Zero means
	// 5s; a negative value means none.
	Leeway time.Duration
	// Clock returns the current time. Defaults to time.Now (set it in tests).
	Clock func() time.Time
}

// Enabled reports whether any key is configured, that is whether tokens can
// be verified at all.
func (c Config) Enabled() bool {
	return len(c.HMACSecret) > 0 || len(c.PublicKeyPEM) > 0
}

// Authenticator verifies tokens against a [Config]. It is immutable
// once built, and its methods may be called concurrently.
type Authenticator struct {
	parser *jwt.Parser
	// keys maps each allowed algorithm to the configured keys it checks.
	keys   map[string]jwt.VerificationKeySet
	algs   []string
	leeway time.Duration
}

// algKind names the key type each supported algorithm needs.
var algKind = map[string]string{
	"HS256": "hmac", "HS384": "hmac", "HS512": "hmac",
	"RS256": "rsa", "RS384": "rsa", "RS512": "rsa",
	"PS256": "rsa", "PS384": "rsa", "PS512": "rsa",
	"ES256": "P-256", "ES384": "P-384", "ES512": "P-521",
	"EdDSA": "ed25519",
}

// hmacMinBytes is RFC 7518 section 3.2's minimum secret length.
var hmacMinBytes = map[string]int{"HS256": 32, "HS384": 48, "HS512": 64}

// keyring is the configured key material, grouped by kind.
type keyring struct {
	hmac    []byte
	rsa     []*rsa.PublicKey
	ec      map[string][]*ecdsa.PublicKey // by curve name
	ed25519 []ed25519.PublicKey
	natural []string // natural algorithms, in the order the keys appear
}

// New checks cfg and builds an Authenticator. It fails when no
// key is configured, on PEM it cannot read (or that holds no public key),
// on unknown or unsupported algorithm names ("none" included), on an
// algorithm for which no key of the right type is configured (HS256 with
// only an RSA key, ES384 with only a P-256 key), on an HMAC secret shorter
// than its algorithm requires and on RSA keys under 2048 bits.
func New(cfg Config) (*Authenticator, error) {
	if !cfg.Enabled() {
		return nil, errors.New("server: auth: no key configured (set HMACSecret or PublicKeyPEM)")
	}
	ks := keyring{ec: make(map[string][]*ecdsa.PublicKey)}
	if len(cfg.HMACSecret) > 0 {
		ks.hmac = slices.Clone(cfg.HMACSecret)
		ks.natural = append(ks.natural, "HS256")
	}
	if len(cfg.PublicKeyPEM) > 0 {
		if err := ks.addPEM(cfg.PublicKeyPEM); err != nil {
			return nil, err
		}
	}

	algs := cfg.Algorithms
	if len(algs) == 0 {
		algs = ks.natural
	}
	a := &Authenticator{keys: make(map[string]jwt.VerificationKeySet)}
	for _, alg := range algs {
		if _, dup := a.keys[alg]; dup {
			continue
		}
		set, err := ks.forAlg(alg)
		if err != nil {
			return nil, err
		}
		a.keys[alg] = set
		a.algs = append(a.algs, alg)
	}

	leeway := cfg.Leeway
	switch {
	case leeway == 0:
		leeway = defaultLeeway
	case leeway < 0:
		leeway = 0
	}
	a.leeway = leeway
	clock := cfg.Clock
	if clock == nil {
		clock = time.Now
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(slices.Clone(a.algs)),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(leeway),
		jwt.WithTimeFunc(clock),
		// Reject base64 with non-zero padding bits, so one token has one
		// spelling.
		jwt.WithStrictDecoding(),
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	a.parser = jwt.NewParser(opts...)
	return a, nil
}

// forAlg returns the keys alg verifies with, or why alg cannot be allowed.
func (ks *keyring) forAlg(alg string) (jwt.VerificationKeySet, error) {
	var set jwt.VerificationKeySet
	kind, ok := algKind[alg]
	if !ok {
		if strings.EqualFold(alg, "none") {
			return set, errors.New(`server: auth: algorithm "none" is never allowed`)
		}
		return set, fmt.Errorf("server: auth: unknown or unsupported algorithm %q (supported: HS256/384/512, RS256/384/512, PS256/384/512, ES256/384/512, EdDSA)", alg)
	}
	switch kind {
	case "hmac":
		if ks.hmac == nil {
			return set, fmt.Errorf("server: auth: algorithm %s needs HMACSecret", alg)
		}
		if n := hmacMinBytes[alg]; len(ks.hmac) < n {
			return set, fmt.Errorf("server: auth: HMACSecret of %d bytes is too short for %s (RFC 7518 requires at least %d)", len(ks.hmac), alg, n)
		}
		set.Keys = append(set.Keys, ks.hmac)
	case "rsa":
		for _, k := range ks.rsa {
			set.Keys = append(set.Keys, k)
		}
	case "ed25519":
		for _, k := range ks.ed25519 {
			set.Keys = append(set.Keys, k)
		}
	default: // an ECDSA curve
		for _, k := range ks.ec[kind] {
			set.Keys = append(set.Keys, k)
		}
	}
	if len(set.Keys) == 0 {
		return set, fmt.Errorf("server: auth: algorithm %s needs a %s public key in PublicKeyPEM, and none is configured", alg, strings.ToUpper(kind))
	}
	return set, nil
}

// addPEM reads every PEM block of data as a public key.
func (ks *keyring) addPEM(data []byte) error {
	rest := data
	n := 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		n++
		var (
			pub any
			err error
		)
		switch block.Type {
		case "PUBLIC KEY":
			pub, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				pub = cert.PublicKey
			}
		default:
			if strings.Contains(block.Type, "PRIVATE") {
				return fmt.Errorf("server: auth: PublicKeyPEM block %d is a %s: give the public key only", n, block.Type)
			}
			return fmt.Errorf("server: auth: PublicKeyPEM block %d has unsupported type %q (want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)", n, block.Type)
		}
		if err != nil {
			return fmt.Errorf("server: auth: PublicKeyPEM block %d (%s): %v", n, block.Type, err)
		}
		if err := ks.addKey(n, pub); err != nil {
			return err
		}
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		if n == 0 {
			return errors.New("server: auth: PublicKeyPEM holds no PEM block")
		}
		return fmt.Errorf("server: auth: PublicKeyPEM has unreadable data after block %d", n)
	}
	if n == 0 {
		return errors.New("server: auth: PublicKeyPEM holds no PEM block")
	}
	return nil
}

// addKey files one parsed public key under its kind.
func (ks *keyring) addKey(n int, pub any) error {
	natural := ""
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < 2048 {
			return fmt.Errorf("server: auth: PublicKeyPEM block %d: RSA key of %d bits is too small (RFC 7518 requires at least 2048)", n, bits)
		}
		ks.rsa = append(ks.rsa, k)
		natural = "RS256"
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			natural = "ES256"
		case elliptic.P384():
			natural = "ES384"
		case elliptic.P521():
			natural = "ES512"
		default:
			return fmt.Errorf("server: auth: PublicKeyPEM block %d: unsupported ECDSA curve %s", n, k.Curve.Params().Name)
		}
		name := k.Curve.Params().Name
		ks.ec[name] = append(ks.ec[name], k)
	case ed25519.PublicKey:
		ks.ed25519 = append(ks.ed25519, k)
		natural = "EdDSA"
	default:
		return fmt.Errorf("server: auth: PublicKeyPEM block %d: unsupported key type %T", n, pub)
	}
	if !slices.Contains(ks.natural, natural) {
		ks.natural = append(ks.natural, natural)
	}
	return nil
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

// Leeway is the clock skew allowed on time claims: a token is valid until
// its "exp" plus Leeway.
func (a *Authenticator) Leeway() time.Duration {
	if a == nil {
		return 0
	}
	return a.leeway
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
// matching rules, are described in the comment at the top of auth.go.
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
