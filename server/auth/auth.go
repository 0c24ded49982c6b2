package auth

import (
	"crypto/ecdsa"
	"errors"
	"slices"
	"time"

	"github.com/golang-jwt/jwt/v5"
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

// defaultLeeway is Config.Leeway's default.
const defaultLeeway = 5 * time.Second

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

// Leeway is the clock skew allowed on time claims: a token is valid until
// its "exp" plus Leeway.
func (a *Authenticator) Leeway() time.Duration {
	if a == nil {
		return 0
	}
	return a.leeway
}
