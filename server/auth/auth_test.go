package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"
)

// testNow is the fixed clock of every test of this package.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func testClock() time.Time { return testNow }

// testKeySet holds keys generated once per test binary (RSA generation
// is slow under -race).
type testKeySet struct {
	secret  []byte
	secret2 []byte
	rsa     *rsa.PrivateKey
	rsa2    *rsa.PrivateKey
	ec256   *ecdsa.PrivateKey
	ec256b  *ecdsa.PrivateKey
	ec384   *ecdsa.PrivateKey
	ec521   *ecdsa.PrivateKey
	ed      ed25519.PrivateKey
	ed2     ed25519.PrivateKey
}

var testKeys = sync.OnceValue(func() *testKeySet {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	k := &testKeySet{secret: make([]byte, 64), secret2: make([]byte, 64)}
	_, err := rand.Read(k.secret)
	must(err)
	_, err = rand.Read(k.secret2)
	must(err)
	k.rsa, err = rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	k.rsa2, err = rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	k.ec256, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	k.ec256b, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	k.ec384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	must(err)
	k.ec521, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	must(err)
	_, k.ed, err = ed25519.GenerateKey(rand.Reader)
	must(err)
	_, k.ed2, err = ed25519.GenerateKey(rand.Reader)
	must(err)
	return k
})

// testPEM encodes public keys as PKIX "PUBLIC KEY" blocks, concatenated.
func testPEM(t testing.TB, pubs ...crypto.PublicKey) []byte {
	t.Helper()
	var out []byte
	for _, pub := range pubs {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	return out
}

// testSign signs claims with method and key.
func testSign(t testing.TB, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatalf("signing %s: %v", method.Alg(), err)
	}
	return s
}

// testRaw builds a token from a raw header, payload and signature.
func testRaw(header, payload string, sig []byte) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(payload)) + "." + enc.EncodeToString(sig)
}

// testClaims returns a valid claim set for alice, expiring in an hour,
// with extra merged in (a nil value deletes a claim).
func testClaims(extra jwt.MapClaims) jwt.MapClaims {
	c := jwt.MapClaims{
		"sub": "alice",
		"exp": testNow.Add(time.Hour).Unix(),
		"iat": testNow.Add(-time.Minute).Unix(),
		"statecast": map[string]any{"grants": []any{
			map[string]any{"room": "lobby:*", "prefix": "", "access": "r"},
			map[string]any{"room": "lobby:*", "prefix": "presence/{sub}", "access": "rw"},
			map[string]any{"room": "doc:{sub}", "access": "rw"},
		}},
	}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

// testWantClaims is what testClaims(nil) verifies to.
func testWantClaims() *Claims {
	return &Claims{
		Subject: "alice",
		Expiry:  testNow.Add(time.Hour),
		Grants: []Grant{
			{Room: "lobby:*", Prefix: "", Access: Read},
			{Room: "lobby:*", Prefix: "presence/{sub}", Access: ReadWrite},
			{Room: "doc:{sub}", Prefix: "", Access: ReadWrite},
		},
	}
}

func testNew(t testing.TB, cfg Config) *Authenticator {
	t.Helper()
	if cfg.Clock == nil {
		cfg.Clock = testClock
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return a
}

var testSentinels = []error{
	ErrTokenMissing, ErrTokenMalformed, ErrTokenSignature,
	ErrTokenExpired, ErrTokenNotYetValid, ErrTokenClaims,
}

// testCheckRejected asserts that Verify rejected token with want (and
// no other sentinel), returned no claims and kept the token out of the
// message.
func testCheckRejected(t *testing.T, token string, claims *Claims, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("Verify accepted the token: %+v", claims)
	}
	if claims != nil {
		t.Errorf("Verify returned claims %+v with error %v", claims, err)
	}
	for _, s := range testSentinels {
		if got := errors.Is(err, s); got != (s == want) {
			t.Errorf("errors.Is(%q, %q) = %v, want %v", err, s, got, !got)
		}
	}
	msg := err.Error()
	if len(token) >= 16 && strings.Contains(msg, token) {
		t.Errorf("error message contains the token: %s", msg)
	}
	for _, part := range strings.Split(token, ".") {
		if len(part) >= 16 && strings.Contains(msg, part) {
			t.Errorf("error message contains a token segment: %s", msg)
		}
	}
}

func TestConfigEnabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want bool
	}{
		{Config{}, false},
		{Config{Issuer: "x", Audience: "y", Algorithms: []string{"HS256"}}, false},
		{Config{HMACSecret: []byte("k")}, true},
		{Config{PublicKeyPEM: []byte("-----BEGIN")}, true},
	} {
		if got := tc.cfg.Enabled(); got != tc.want {
			t.Errorf("%+v.Enabled() = %v, want %v", tc.cfg, got, tc.want)
		}
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	k := testKeys()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(k.ec256)
	if err != nil {
		t.Fatal(err)
	}
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER})
	rsaPEM := testPEM(t, &k.rsa.PublicKey)
	ecPEM := testPEM(t, &k.ec256.PublicKey)

	for _, tc := range []struct {
		name    string
		cfg     Config
		wantSub string // in the error message
	}{
		{"nothing configured", Config{}, "no key configured"},
		{"nothing but algorithms", Config{Algorithms: []string{"HS256"}}, "no key configured"},
		{"PEM garbage", Config{PublicKeyPEM: []byte("not a pem")}, "no PEM block"},
		{"PEM truncated", Config{PublicKeyPEM: rsaPEM[:len(rsaPEM)/2]}, "no PEM block"},
		{"PEM bad DER", Config{PublicKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("junk")})}, "block 1"},
		{"PEM trailing garbage", Config{PublicKeyPEM: append(append([]byte{}, rsaPEM...), "garbage"...)}, "after block 1"},
		{"PEM private key", Config{PublicKeyPEM: privPEM}, "public key only"},
		{"PEM unknown block", Config{PublicKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "FOO", Bytes: []byte{1}})}, "unsupported type"},
		{"RSA 1024", Config{PublicKeyPEM: testPEM(t, &small.PublicKey)}, "too small"},
		{"unknown alg", Config{HMACSecret: k.secret, Algorithms: []string{"HS999"}}, "unknown or unsupported"},
		{"lowercase alg", Config{HMACSecret: k.secret, Algorithms: []string{"hs256"}}, "unknown or unsupported"},
		{"alg none", Config{HMACSecret: k.secret, Algorithms: []string{"none"}}, `"none" is never allowed`},
		{"alg None", Config{HMACSecret: k.secret, Algorithms: []string{"HS256", "None"}}, `"none" is never allowed`},
		{"HS256 with only RSA", Config{PublicKeyPEM: rsaPEM, Algorithms: []string{"HS256"}}, "needs HMACSecret"},
		{"RS256 with only HMAC", Config{HMACSecret: k.secret, Algorithms: []string{"RS256"}}, "RSA public key"},
		{"PS256 with only EC", Config{PublicKeyPEM: ecPEM, Algorithms: []string{"PS256"}}, "RSA public key"},
		{"ES384 with only P-256", Config{PublicKeyPEM: ecPEM, Algorithms: []string{"ES384"}}, "P-384 public key"},
		{"EdDSA with only RSA", Config{PublicKeyPEM: rsaPEM, Algorithms: []string{"EdDSA"}}, "ED25519 public key"},
		{"HS256 short secret", Config{HMACSecret: []byte("secret")}, "too short for HS256"},
		{"HS512 secret of 32", Config{HMACSecret: k.secret[:32], Algorithms: []string{"HS512"}}, "too short for HS512"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.cfg)
			if err == nil {
				t.Fatalf("New succeeded: %+v", a)
			}
			if !strings.Contains(err.Error(), tc.wantSub) {
				t.Errorf("error %q does not mention %q", err, tc.wantSub)
			}
		})
	}
}

func TestDefaultAlgorithms(t *testing.T) {
	t.Parallel()
	k := testKeys()
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"HMAC", Config{HMACSecret: k.secret}, []string{"HS256"}},
		{"RSA", Config{PublicKeyPEM: testPEM(t, &k.rsa.PublicKey)}, []string{"RS256"}},
		{"EC curves", Config{PublicKeyPEM: testPEM(t, &k.ec384.PublicKey, &k.ec256.PublicKey, &k.ec521.PublicKey)}, []string{"ES384", "ES256", "ES512"}},
		{"Ed25519", Config{PublicKeyPEM: testPEM(t, k.ed.Public())}, []string{"EdDSA"}},
		{"HMAC and keys", Config{HMACSecret: k.secret, PublicKeyPEM: testPEM(t, &k.rsa.PublicKey, &k.rsa2.PublicKey, k.ed.Public())}, []string{"HS256", "RS256", "EdDSA"}},
		{"explicit, deduplicated", Config{HMACSecret: k.secret, Algorithms: []string{"HS512", "HS256", "HS512"}}, []string{"HS512", "HS256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := testNew(t, tc.cfg)
			if diff := cmp.Diff(tc.want, a.algs); diff != "" {
				t.Errorf("algorithms (-want +got):\n%s", diff)
			}
		})
	}
}
