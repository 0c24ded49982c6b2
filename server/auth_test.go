package server

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"
)

// authTestNow is the fixed clock of every test here.
var authTestNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func authTestClock() time.Time { return authTestNow }

// authTestKeySet holds keys generated once per test binary (RSA generation
// is slow under -race).
type authTestKeySet struct {
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

var authTestKeys = sync.OnceValue(func() *authTestKeySet {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	k := &authTestKeySet{secret: make([]byte, 64), secret2: make([]byte, 64)}
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

// authTestPEM encodes public keys as PKIX "PUBLIC KEY" blocks, concatenated.
func authTestPEM(t testing.TB, pubs ...crypto.PublicKey) []byte {
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

// authTestSign signs claims with method and key.
func authTestSign(t testing.TB, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatalf("signing %s: %v", method.Alg(), err)
	}
	return s
}

// authTestRaw builds a token from a raw header, payload and signature.
func authTestRaw(header, payload string, sig []byte) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(payload)) + "." + enc.EncodeToString(sig)
}

// authTestClaims returns a valid claim set for alice, expiring in an hour,
// with extra merged in (a nil value deletes a claim).
func authTestClaims(extra jwt.MapClaims) jwt.MapClaims {
	c := jwt.MapClaims{
		"sub": "alice",
		"exp": authTestNow.Add(time.Hour).Unix(),
		"iat": authTestNow.Add(-time.Minute).Unix(),
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

// authTestWantClaims is what authTestClaims(nil) verifies to.
func authTestWantClaims() *Claims {
	return &Claims{
		Subject: "alice",
		Expiry:  authTestNow.Add(time.Hour),
		Grants: []Grant{
			{Room: "lobby:*", Prefix: "", Access: Read},
			{Room: "lobby:*", Prefix: "presence/{sub}", Access: ReadWrite},
			{Room: "doc:{sub}", Prefix: "", Access: ReadWrite},
		},
	}
}

func authTestNew(t testing.TB, cfg AuthConfig) *Authenticator {
	t.Helper()
	if cfg.Clock == nil {
		cfg.Clock = authTestClock
	}
	a, err := NewAuthenticator(cfg)
	if err != nil {
		t.Fatalf("NewAuthenticator: %v", err)
	}
	return a
}

var authTestSentinels = []error{
	ErrTokenMissing, ErrTokenMalformed, ErrTokenSignature,
	ErrTokenExpired, ErrTokenNotYetValid, ErrTokenClaims,
}

// authTestCheckRejected asserts that Verify rejected token with want (and
// no other sentinel), returned no claims and kept the token out of the
// message.
func authTestCheckRejected(t *testing.T, token string, claims *Claims, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("Verify accepted the token: %+v", claims)
	}
	if claims != nil {
		t.Errorf("Verify returned claims %+v with error %v", claims, err)
	}
	for _, s := range authTestSentinels {
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

func TestAuthConfigEnabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  AuthConfig
		want bool
	}{
		{AuthConfig{}, false},
		{AuthConfig{Issuer: "x", Audience: "y", Algorithms: []string{"HS256"}}, false},
		{AuthConfig{HMACSecret: []byte("k")}, true},
		{AuthConfig{PublicKeyPEM: []byte("-----BEGIN")}, true},
	} {
		if got := tc.cfg.Enabled(); got != tc.want {
			t.Errorf("%+v.Enabled() = %v, want %v", tc.cfg, got, tc.want)
		}
	}
}

func TestAuthNewAuthenticatorErrors(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(k.ec256)
	if err != nil {
		t.Fatal(err)
	}
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER})
	rsaPEM := authTestPEM(t, &k.rsa.PublicKey)
	ecPEM := authTestPEM(t, &k.ec256.PublicKey)

	for _, tc := range []struct {
		name    string
		cfg     AuthConfig
		wantSub string // in the error message
	}{
		{"nothing configured", AuthConfig{}, "no key configured"},
		{"nothing but algorithms", AuthConfig{Algorithms: []string{"HS256"}}, "no key configured"},
		{"PEM garbage", AuthConfig{PublicKeyPEM: []byte("not a pem")}, "no PEM block"},
		{"PEM truncated", AuthConfig{PublicKeyPEM: rsaPEM[:len(rsaPEM)/2]}, "no PEM block"},
		{"PEM bad DER", AuthConfig{PublicKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("junk")})}, "block 1"},
		{"PEM trailing garbage", AuthConfig{PublicKeyPEM: append(append([]byte{}, rsaPEM...), "garbage"...)}, "after block 1"},
		{"PEM private key", AuthConfig{PublicKeyPEM: privPEM}, "public key only"},
		{"PEM unknown block", AuthConfig{PublicKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "FOO", Bytes: []byte{1}})}, "unsupported type"},
		{"RSA 1024", AuthConfig{PublicKeyPEM: authTestPEM(t, &small.PublicKey)}, "too small"},
		{"unknown alg", AuthConfig{HMACSecret: k.secret, Algorithms: []string{"HS999"}}, "unknown or unsupported"},
		{"lowercase alg", AuthConfig{HMACSecret: k.secret, Algorithms: []string{"hs256"}}, "unknown or unsupported"},
		{"alg none", AuthConfig{HMACSecret: k.secret, Algorithms: []string{"none"}}, `"none" is never allowed`},
		{"alg None", AuthConfig{HMACSecret: k.secret, Algorithms: []string{"HS256", "None"}}, `"none" is never allowed`},
		{"HS256 with only RSA", AuthConfig{PublicKeyPEM: rsaPEM, Algorithms: []string{"HS256"}}, "needs HMACSecret"},
		{"RS256 with only HMAC", AuthConfig{HMACSecret: k.secret, Algorithms: []string{"RS256"}}, "RSA public key"},
		{"PS256 with only EC", AuthConfig{PublicKeyPEM: ecPEM, Algorithms: []string{"PS256"}}, "RSA public key"},
		{"ES384 with only P-256", AuthConfig{PublicKeyPEM: ecPEM, Algorithms: []string{"ES384"}}, "P-384 public key"},
		{"EdDSA with only RSA", AuthConfig{PublicKeyPEM: rsaPEM, Algorithms: []string{"EdDSA"}}, "ED25519 public key"},
		{"HS256 short secret", AuthConfig{HMACSecret: []byte("secret")}, "too short for HS256"},
		{"HS512 secret of 32", AuthConfig{HMACSecret: k.secret[:32], Algorithms: []string{"HS512"}}, "too short for HS512"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewAuthenticator(tc.cfg)
			if err == nil {
				t.Fatalf("NewAuthenticator succeeded: %+v", a)
			}
			if !strings.Contains(err.Error(), tc.wantSub) {
				t.Errorf("error %q does not mention %q", err, tc.wantSub)
			}
		})
	}
}

func TestAuthDefaultAlgorithms(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	for _, tc := range []struct {
		name string
		cfg  AuthConfig
		want []string
	}{
		{"HMAC", AuthConfig{HMACSecret: k.secret}, []string{"HS256"}},
		{"RSA", AuthConfig{PublicKeyPEM: authTestPEM(t, &k.rsa.PublicKey)}, []string{"RS256"}},
		{"EC curves", AuthConfig{PublicKeyPEM: authTestPEM(t, &k.ec384.PublicKey, &k.ec256.PublicKey, &k.ec521.PublicKey)}, []string{"ES384", "ES256", "ES512"}},
		{"Ed25519", AuthConfig{PublicKeyPEM: authTestPEM(t, k.ed.Public())}, []string{"EdDSA"}},
		{"HMAC and keys", AuthConfig{HMACSecret: k.secret, PublicKeyPEM: authTestPEM(t, &k.rsa.PublicKey, &k.rsa2.PublicKey, k.ed.Public())}, []string{"HS256", "RS256", "EdDSA"}},
		{"explicit, deduplicated", AuthConfig{HMACSecret: k.secret, Algorithms: []string{"HS512", "HS256", "HS512"}}, []string{"HS512", "HS256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := authTestNew(t, tc.cfg)
			if diff := cmp.Diff(tc.want, a.algs); diff != "" {
				t.Errorf("algorithms (-want +got):\n%s", diff)
			}
		})
	}
}

func TestVerifyValidTokens(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	all := authTestPEM(t, &k.rsa.PublicKey, &k.ec256.PublicKey, &k.ec384.PublicKey, &k.ec521.PublicKey, k.ed.Public())
	certPEM := func() []byte {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: authTestNow.Add(-time.Hour), NotAfter: authTestNow.Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.ed.Public(), k.ed)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}()
	pkcs1PEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey)})

	for _, tc := range []struct {
		name   string
		cfg    AuthConfig
		method jwt.SigningMethod
		key    any
	}{
		{"HS256", AuthConfig{HMACSecret: k.secret}, jwt.SigningMethodHS256, k.secret},
		{"HS384", AuthConfig{HMACSecret: k.secret, Algorithms: []string{"HS384"}}, jwt.SigningMethodHS384, k.secret},
		{"HS512", AuthConfig{HMACSecret: k.secret, Algorithms: []string{"HS256", "HS512"}}, jwt.SigningMethodHS512, k.secret},
		{"RS256", AuthConfig{PublicKeyPEM: authTestPEM(t, &k.rsa.PublicKey)}, jwt.SigningMethodRS256, k.rsa},
		{"RS256 PKCS1 PEM", AuthConfig{PublicKeyPEM: pkcs1PEM}, jwt.SigningMethodRS256, k.rsa},
		{"RS512", AuthConfig{PublicKeyPEM: authTestPEM(t, &k.rsa.PublicKey), Algorithms: []string{"RS512"}}, jwt.SigningMethodRS512, k.rsa},
		{"PS256", AuthConfig{PublicKeyPEM: authTestPEM(t, &k.rsa.PublicKey), Algorithms: []string{"PS256"}}, jwt.SigningMethodPS256, k.rsa},
		{"ES256", AuthConfig{PublicKeyPEM: authTestPEM(t, &k.ec256.PublicKey)}, jwt.SigningMethodES256, k.ec256},
		{"ES384", AuthConfig{PublicKeyPEM: authTestPEM(t, &k.ec384.PublicKey)}, jwt.SigningMethodES384, k.ec384},
		{"ES512", AuthConfig{PublicKeyPEM: authTestPEM(t, &k.ec521.PublicKey)}, jwt.SigningMethodES512, k.ec521},
		{"EdDSA", AuthConfig{PublicKeyPEM: authTestPEM(t, k.ed.Public())}, jwt.SigningMethodEdDSA, k.ed},
		{"EdDSA from certificate", AuthConfig{PublicKeyPEM: certPEM}, jwt.SigningMethodEdDSA, k.ed},
		{"several PEM blocks: RSA", AuthConfig{PublicKeyPEM: all}, jwt.SigningMethodRS256, k.rsa},
		{"several PEM blocks: ES256", AuthConfig{PublicKeyPEM: all}, jwt.SigningMethodES256, k.ec256},
		{"several PEM blocks: ES512", AuthConfig{PublicKeyPEM: all}, jwt.SigningMethodES512, k.ec521},
		{"several PEM blocks: EdDSA", AuthConfig{PublicKeyPEM: all}, jwt.SigningMethodEdDSA, k.ed},
		{"second of two RSA keys", AuthConfig{PublicKeyPEM: authTestPEM(t, &k.rsa2.PublicKey, &k.rsa.PublicKey)}, jwt.SigningMethodRS256, k.rsa},
		{"HMAC and RSA together: HS256", AuthConfig{HMACSecret: k.secret, PublicKeyPEM: authTestPEM(t, &k.rsa.PublicKey)}, jwt.SigningMethodHS256, k.secret},
		{"HMAC and RSA together: RS256", AuthConfig{HMACSecret: k.secret, PublicKeyPEM: authTestPEM(t, &k.rsa.PublicKey)}, jwt.SigningMethodRS256, k.rsa},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := authTestNew(t, tc.cfg)
			tok := authTestSign(t, tc.method, tc.key, authTestClaims(nil))
			got, err := a.Verify(tok)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if diff := cmp.Diff(authTestWantClaims(), got); diff != "" {
				t.Errorf("claims (-want +got):\n%s", diff)
			}
		})
	}
}

func TestVerifyIssuerAudienceAccepted(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	a := authTestNew(t, AuthConfig{HMACSecret: k.secret, Issuer: "https://issuer.example", Audience: "statecast"})
	for _, aud := range []any{"statecast", []any{"other", "statecast"}} {
		tok := authTestSign(t, jwt.SigningMethodHS256, k.secret, authTestClaims(jwt.MapClaims{"iss": "https://issuer.example", "aud": aud}))
		if _, err := a.Verify(tok); err != nil {
			t.Errorf("aud %v: Verify: %v", aud, err)
		}
	}
}

func TestVerifyRejects(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	rsaPEM := authTestPEM(t, &k.rsa.PublicKey)
	hsCfg := AuthConfig{HMACSecret: k.secret}
	rsaCfg := AuthConfig{PublicKeyPEM: rsaPEM}
	edCfg := AuthConfig{PublicKeyPEM: authTestPEM(t, k.ed.Public())}
	ecCfg := AuthConfig{PublicKeyPEM: authTestPEM(t, &k.ec256.PublicKey)}
	issCfg := AuthConfig{HMACSecret: k.secret, Issuer: "https://issuer.example", Audience: "statecast"}
	hs := func(extra jwt.MapClaims) string {
		return authTestSign(t, jwt.SigningMethodHS256, k.secret, authTestClaims(extra))
	}
	grants := func(gs ...any) string {
		return hs(jwt.MapClaims{"statecast": map[string]any{"grants": gs}})
	}
	payload, err := json.Marshal(authTestClaims(nil))
	if err != nil {
		t.Fatal(err)
	}
	valid := hs(nil)
	parts := strings.Split(valid, ".")

	// The classic key confusion: an HS256 token whose HMAC key is the RSA
	// public key as the server holds it.
	confused := authTestSign(t, jwt.SigningMethodHS256, rsaPEM, authTestClaims(nil))
	// The same with the DER bytes, for servers that would keep those.
	der, err := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	confusedDER := authTestSign(t, jwt.SigningMethodHS256, der, authTestClaims(nil))

	// An RS256 signature on the payload, relabelled as PS256: right key,
	// wrong algorithm.
	rs := authTestSign(t, jwt.SigningMethodRS256, k.rsa, authTestClaims(nil))
	rsParts := strings.Split(rs, ".")
	relabelled := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"PS256","typ":"JWT"}`)) + "." + rsParts[1] + "." + rsParts[2]

	// A valid HS256 token with a "crit" header.
	critHeader := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","crit":["exp"],"exp":1}`))
	critMAC := hmac.New(sha256.New, k.secret)
	critMAC.Write([]byte(critHeader + "." + parts[1]))
	crit := critHeader + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(critMAC.Sum(nil))

	// Non-canonical base64 in the signature: the same bytes with a
	// non-zero padding bit (a 32-byte MAC leaves 2 spare bits).
	sig := []byte(parts[2])
	last := strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", sig[len(sig)-1])
	sig[len(sig)-1] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last^1]
	malleated := parts[0] + "." + parts[1] + "." + string(sig)

	huge := authTestSign(t, jwt.SigningMethodHS256, k.secret, authTestClaims(jwt.MapClaims{"pad": strings.Repeat("x", 1<<20)}))

	tooMany := make([]any, authMaxGrants+1)
	for i := range tooMany {
		tooMany[i] = map[string]any{"room": "r", "access": "r"}
	}

	for _, tc := range []struct {
		name  string
		cfg   AuthConfig
		token string
		want  error
	}{
		// Signatures and algorithms.
		{"HS256 other secret", hsCfg, authTestSign(t, jwt.SigningMethodHS256, k.secret2, authTestClaims(nil)), ErrTokenSignature},
		{"HS256 tampered payload", hsCfg, parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), `"alice"`, `"admin"`, 1))) + "." + parts[2], ErrTokenSignature},
		{"HS256 signature stripped", hsCfg, parts[0] + "." + parts[1] + ".", ErrTokenSignature},
		{"HS256 non-canonical base64 signature", hsCfg, malleated, ErrTokenMalformed},
		{"RS256 other key", rsaCfg, authTestSign(t, jwt.SigningMethodRS256, k.rsa2, authTestClaims(nil)), ErrTokenSignature},
		{"ES256 other key", ecCfg, authTestSign(t, jwt.SigningMethodES256, k.ec256b, authTestClaims(nil)), ErrTokenSignature},
		{"EdDSA other key", edCfg, authTestSign(t, jwt.SigningMethodEdDSA, k.ed2, authTestClaims(nil)), ErrTokenSignature},
		{"alg none, HMAC configured", hsCfg, authTestRaw(`{"alg":"none"}`, string(payload), nil), ErrTokenSignature},
		{"alg none, RSA configured", rsaCfg, authTestRaw(`{"alg":"none","typ":"JWT"}`, string(payload), nil), ErrTokenSignature},
		{"alg NONE", hsCfg, authTestRaw(`{"alg":"NONE"}`, string(payload), nil), ErrTokenSignature},
		{"alg missing", hsCfg, authTestRaw(`{"typ":"JWT"}`, string(payload), []byte("x")), ErrTokenSignature},
		{"alg unknown", hsCfg, authTestRaw(`{"alg":"HS1024"}`, string(payload), []byte("x")), ErrTokenSignature},
		{"key confusion: HS256 with RSA PEM as secret", rsaCfg, confused, ErrTokenSignature},
		{"key confusion: HS256 with RSA DER as secret", rsaCfg, confusedDER, ErrTokenSignature},
		{"RS256 when only HS256 allowed", hsCfg, rs, ErrTokenSignature},
		{"RS256 relabelled PS256", rsaCfg, relabelled, ErrTokenSignature},
		{"ES384 token, only P-256 configured", ecCfg, authTestSign(t, jwt.SigningMethodES384, k.ec384, authTestClaims(nil)), ErrTokenSignature},
		{"HS384 token, only HS256 allowed", hsCfg, authTestSign(t, jwt.SigningMethodHS384, k.secret, authTestClaims(nil)), ErrTokenSignature},
		{"EdDSA token, only RSA configured", rsaCfg, authTestSign(t, jwt.SigningMethodEdDSA, k.ed, authTestClaims(nil)), ErrTokenSignature},

		// Time.
		{"expired", hsCfg, hs(jwt.MapClaims{"exp": authTestNow.Add(-time.Minute).Unix()}), ErrTokenExpired},
		{"expired beyond leeway", hsCfg, hs(jwt.MapClaims{"exp": authTestNow.Add(-6 * time.Second).Unix()}), ErrTokenExpired},
		{"expired, no leeway", AuthConfig{HMACSecret: k.secret, Leeway: -1}, hs(jwt.MapClaims{"exp": authTestNow.Add(-time.Second).Unix()}), ErrTokenExpired},
		{"no sub", hsCfg, hs(jwt.MapClaims{"sub": nil}), ErrTokenClaims},
		{"empty sub", hsCfg, hs(jwt.MapClaims{"sub": ""}), ErrTokenClaims},
		{"nbf in the future", hsCfg, hs(jwt.MapClaims{"nbf": authTestNow.Add(time.Minute).Unix()}), ErrTokenNotYetValid},
		{"nbf beyond leeway", hsCfg, hs(jwt.MapClaims{"nbf": authTestNow.Add(6 * time.Second).Unix()}), ErrTokenNotYetValid},
		{"nbf beyond a larger leeway", AuthConfig{HMACSecret: k.secret, Leeway: time.Minute}, hs(jwt.MapClaims{"nbf": authTestNow.Add(61 * time.Second).Unix()}), ErrTokenNotYetValid},
		{"iat in the future", hsCfg, hs(jwt.MapClaims{"iat": authTestNow.Add(time.Hour).Unix()}), ErrTokenNotYetValid},

		// Registered claims.
		{"missing exp", hsCfg, hs(jwt.MapClaims{"exp": nil}), ErrTokenClaims},
		{"wrong iss", issCfg, hs(jwt.MapClaims{"iss": "https://evil.example", "aud": "statecast"}), ErrTokenClaims},
		{"missing iss", issCfg, hs(jwt.MapClaims{"aud": "statecast"}), ErrTokenClaims},
		{"wrong aud", issCfg, hs(jwt.MapClaims{"iss": "https://issuer.example", "aud": "other"}), ErrTokenClaims},
		{"wrong aud list", issCfg, hs(jwt.MapClaims{"iss": "https://issuer.example", "aud": []string{"a", "b"}}), ErrTokenClaims},
		{"missing aud", issCfg, hs(jwt.MapClaims{"iss": "https://issuer.example"}), ErrTokenClaims},
		{"wrong iss and expired", issCfg, hs(jwt.MapClaims{"iss": "x", "aud": "statecast", "exp": authTestNow.Add(-time.Hour).Unix()}), ErrTokenClaims},
		{"exp of the wrong type", hsCfg, hs(jwt.MapClaims{"exp": "tomorrow"}), ErrTokenMalformed},
		{"exp a numeric string", hsCfg, hs(jwt.MapClaims{"exp": fmt.Sprint(authTestNow.Add(time.Hour).Unix())}), ErrTokenMalformed},
		{"nbf a numeric string", hsCfg, hs(jwt.MapClaims{"nbf": fmt.Sprint(authTestNow.Unix())}), ErrTokenMalformed},
		{"iat a numeric string", hsCfg, hs(jwt.MapClaims{"iat": fmt.Sprint(authTestNow.Unix())}), ErrTokenMalformed},
		{"exp a boolean", hsCfg, hs(jwt.MapClaims{"exp": true}), ErrTokenMalformed},
		{"exp 1e20", hsCfg, hs(jwt.MapClaims{"exp": 1e20}), ErrTokenClaims},
		{"exp after the year 9999", hsCfg, hs(jwt.MapClaims{"exp": 253402300800}), ErrTokenClaims},
		{"exp before 1970", hsCfg, hs(jwt.MapClaims{"exp": -1}), ErrTokenClaims},
		{"nbf 1e300", hsCfg, hs(jwt.MapClaims{"nbf": 1e300}), ErrTokenClaims},

		// The statecast claim.
		{"statecast not an object", hsCfg, hs(jwt.MapClaims{"statecast": "all"}), ErrTokenClaims},
		{"grants not a list", hsCfg, hs(jwt.MapClaims{"statecast": map[string]any{"grants": "all"}}), ErrTokenClaims},
		{"unknown statecast field", hsCfg, hs(jwt.MapClaims{"statecast": map[string]any{"grant": []any{}}}), ErrTokenClaims},
		{"misspelt prefix", hsCfg, grants(map[string]any{"room": "r", "prefx": "a/", "access": "r"}), ErrTokenClaims},
		{"access missing", hsCfg, grants(map[string]any{"room": "r"}), ErrTokenClaims},
		{"access unknown", hsCfg, grants(map[string]any{"room": "r", "access": "admin"}), ErrTokenClaims},
		{"access wr", hsCfg, grants(map[string]any{"room": "r", "access": "wr"}), ErrTokenClaims},
		{"access a number", hsCfg, grants(map[string]any{"room": "r", "access": 3}), ErrTokenClaims},
		{"room missing", hsCfg, grants(map[string]any{"access": "r"}), ErrTokenClaims},
		{"room with slash", hsCfg, grants(map[string]any{"room": "a/b", "access": "r"}), ErrTokenClaims},
		{"room with a stray brace", hsCfg, grants(map[string]any{"room": "doc:{user}", "access": "r"}), ErrTokenClaims},
		{"room too long", hsCfg, grants(map[string]any{"room": strings.Repeat("a", authMaxRoomPattern+1), "access": "r"}), ErrTokenClaims},
		{"prefix with star", hsCfg, grants(map[string]any{"room": "r", "prefix": "presence/*", "access": "r"}), ErrTokenClaims},
		{"prefix with a stray brace", hsCfg, grants(map[string]any{"room": "r", "prefix": "a/{", "access": "r"}), ErrTokenClaims},
		{"prefix with NUL", hsCfg, grants(map[string]any{"room": "r", "prefix": "a\x00", "access": "r"}), ErrTokenClaims},
		{"too many grants", hsCfg, grants(tooMany...), ErrTokenClaims},

		// Malformed input.
		{"empty", hsCfg, "", ErrTokenMissing},
		{"garbage", hsCfg, "garbage", ErrTokenMalformed},
		{"binary garbage", hsCfg, "\x00\xff\xfe.\x01.\x02", ErrTokenMalformed},
		{"two dots", hsCfg, "..", ErrTokenMalformed},
		{"three dots", hsCfg, "...", ErrTokenMalformed},
		{"four segments", hsCfg, valid + ".x", ErrTokenMalformed},
		{"two segments", hsCfg, parts[0] + "." + parts[1], ErrTokenMalformed},
		{"bearer prefix", hsCfg, "Bearer " + valid, ErrTokenMalformed},
		{"surrounding space", hsCfg, " " + valid, ErrTokenMalformed},
		{"padded base64", hsCfg, parts[0] + "=." + parts[1] + "." + parts[2], ErrTokenMalformed},
		{"header not JSON", hsCfg, authTestRaw(`alg`, string(payload), nil), ErrTokenMalformed},
		{"payload not JSON", hsCfg, authTestRaw(`{"alg":"HS256"}`, `{`, nil), ErrTokenMalformed},
		{"payload an array", hsCfg, authTestRaw(`{"alg":"HS256"}`, `[1]`, nil), ErrTokenMalformed},
		{"crit header", hsCfg, crit, ErrTokenMalformed},
		{"huge (1 MiB)", hsCfg, huge, ErrTokenMalformed},
		{"huge garbage", hsCfg, strings.Repeat("a.", 1<<19), ErrTokenMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := authTestNew(t, tc.cfg)
			got, err := a.Verify(tc.token)
			authTestCheckRejected(t, tc.token, got, err, tc.want)
		})
	}
}

func TestVerifyLeewayAccepts(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	a := authTestNew(t, AuthConfig{HMACSecret: k.secret})
	for name, extra := range map[string]jwt.MapClaims{
		"exp 4s ago":     {"exp": authTestNow.Add(-4 * time.Second).Unix()},
		"nbf in 4s":      {"nbf": authTestNow.Add(4 * time.Second).Unix()},
		"iat in 4s":      {"iat": authTestNow.Add(4 * time.Second).Unix()},
		"nbf now":        {"nbf": authTestNow.Unix()},
		"no iat":         {"iat": nil},
		"no grants":      {"statecast": nil},
		"null grants":    {"statecast": map[string]any{"grants": nil}},
		"empty claim":    {"statecast": map[string]any{}},
		"exp in a year":  {"exp": authTestNow.AddDate(1, 0, 0).Unix()},
		"exp in 9999":    {"exp": 253402300799},
		"exp fractional": {"exp": float64(authTestNow.Unix()) + 0.5},
	} {
		tok := authTestSign(t, jwt.SigningMethodHS256, k.secret, authTestClaims(extra))
		if _, err := a.Verify(tok); err != nil {
			t.Errorf("%s: Verify: %v", name, err)
		}
	}
}

func TestVerifyHugeTokenIsFast(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	a := authTestNew(t, AuthConfig{PublicKeyPEM: authTestPEM(t, &k.rsa.PublicKey)})
	huge := strings.Repeat("A", 1<<20) + "." + strings.Repeat("B", 1<<20) + "." + strings.Repeat("C", 1<<20)
	start := time.Now()
	for range 100 {
		if _, err := a.Verify(huge); !errors.Is(err, ErrTokenMalformed) {
			t.Fatalf("Verify(huge) = %v, want ErrTokenMalformed", err)
		}
	}
	// 100 rejections of 3 MiB should take microseconds: the size check comes
	// before any decoding. The bound is loose for slow -race machines.
	if d := time.Since(start); d > time.Second {
		t.Errorf("100 huge tokens took %v", d)
	}
}

func TestVerifyNilAuthenticator(t *testing.T) {
	t.Parallel()
	var a *Authenticator
	got, err := a.Verify("a.b.c")
	authTestCheckRejected(t, "a.b.c", got, err, ErrTokenSignature)
}

func TestVerifyConcurrent(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	a := authTestNew(t, AuthConfig{HMACSecret: k.secret, PublicKeyPEM: authTestPEM(t, k.ed.Public())})
	good := []string{
		authTestSign(t, jwt.SigningMethodHS256, k.secret, authTestClaims(nil)),
		authTestSign(t, jwt.SigningMethodEdDSA, k.ed, authTestClaims(nil)),
	}
	bad := authTestSign(t, jwt.SigningMethodEdDSA, k.ed2, authTestClaims(nil))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				c, err := a.Verify(good[(i+j)%2])
				if err != nil || !c.CanWrite("doc:alice", "x") {
					t.Errorf("Verify good: %v", err)
					return
				}
				if _, err := a.Verify(bad); !errors.Is(err, ErrTokenSignature) {
					t.Errorf("Verify bad: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestVerifyDocumentedExample verifies the claim of the package doc and
// checks the permissions it describes.
func TestVerifyDocumentedExample(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	a := authTestNew(t, AuthConfig{HMACSecret: k.secret})
	payload := `{"sub":"alice","exp":` + fmt.Sprint(authTestNow.Add(time.Hour).Unix()) + `,
	 "statecast":{"grants":[{"room":"lobby:*","prefix":"","access":"r"},
	                        {"room":"lobby:*","prefix":"presence/{sub}","access":"rw"},
	                        {"room":"doc:{sub}","access":"rw"}]}}`
	header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	body := base64.RawURLEncoding.EncodeToString([]byte(payload))
	mac := hmac.New(sha256.New, k.secret)
	mac.Write([]byte(header + "." + body))
	tok := header + "." + body + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))

	c, err := a.Verify(tok)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if diff := cmp.Diff(authTestWantClaims(), c); diff != "" {
		t.Errorf("claims (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		op, room, s string
		want        bool
	}{
		{"read", "lobby:eu", "", true},
		{"read", "lobby:", "games/", true},
		{"write", "lobby:eu", "games/1", false},
		{"write", "lobby:eu", "presence/alice", true},
		{"write", "lobby:eu", "presence/bob", false},
		{"read", "doc:alice", "", true},
		{"write", "doc:alice", "title", true},
		{"read", "doc:bob", "", false},
		{"write", "doc:bob", "title", false},
		{"read", "lobbies", "", false},
	} {
		got := c.CanRead(tc.room, tc.s)
		if tc.op == "write" {
			got = c.CanWrite(tc.room, tc.s)
		}
		if got != tc.want {
			t.Errorf("%s(%q, %q) = %v, want %v", tc.op, tc.room, tc.s, got, tc.want)
		}
	}
}

func TestClaimsCanReadCanWrite(t *testing.T) {
	t.Parallel()
	type check struct {
		op   string // "r" = CanRead(room, prefix), "w" = CanWrite(room, key)
		room string
		s    string
		want bool
	}
	for _, tc := range []struct {
		name   string
		claims *Claims
		checks []check
	}{
		{
			name:   "room star suffix",
			claims: &Claims{Subject: "alice", Grants: []Grant{{Room: "lobby:*", Access: Read}}},
			checks: []check{
				{"r", "lobby:eu", "", true},
				{"r", "lobby:", "", true},
				{"r", "lobby:eu:west", "x/", true},
				{"r", "lobby", "", false},
				{"r", "xlobby:eu", "", false},
				{"r", "Lobby:eu", "", false},
				{"w", "lobby:eu", "k", false},
			},
		},
		{
			name:   "room star everywhere",
			claims: &Claims{Grants: []Grant{{Room: "*", Access: ReadWrite}}},
			checks: []check{
				{"r", "a", "", true},
				{"r", "anything:at@all", "p/", true},
				{"w", "x", "any/key", true},
				{"r", "", "", true},
			},
		},
		{
			name:   "room star in the middle",
			claims: &Claims{Grants: []Grant{{Room: "game:*:chat", Access: Read}}},
			checks: []check{
				{"r", "game:1:chat", "", true},
				{"r", "game::chat", "", true},
				{"r", "game:1:2:chat", "", true},
				{"r", "game:1:chat:x", "", false},
				{"r", "game:chat", "", false},
			},
		},
		{
			name:   "exact room",
			claims: &Claims{Grants: []Grant{{Room: "lobby", Access: Read}}},
			checks: []check{
				{"r", "lobby", "", true},
				{"r", "lobby2", "", false},
				{"r", "lobb", "", false},
				{"r", "*", "", false},
			},
		},
		{
			name:   "no path semantics for slash or colon",
			claims: &Claims{Grants: []Grant{{Room: "a*", Access: Read}}},
			checks: []check{
				{"r", "a/b/c", "", true},
				{"r", "a:b:c", "", true},
			},
		},
		{
			name:   "read prefix containment",
			claims: &Claims{Grants: []Grant{{Room: "r", Prefix: "presence/", Access: Read}}},
			checks: []check{
				{"r", "r", "presence/alice", true},
				{"r", "r", "presence/", true},
				{"r", "r", "", false},
				{"r", "r", "pres", false},
				{"r", "r", "presence", false},
				{"r", "r", "other/", false},
				{"w", "r", "presence/alice", false},
			},
		},
		{
			name:   "write presence/{sub}: prefix semantics",
			claims: &Claims{Subject: "alice", Grants: []Grant{{Room: "lobby:*", Prefix: "presence/{sub}", Access: ReadWrite}}},
			checks: []check{
				{"w", "lobby:1", "presence/alice", true},
				{"w", "lobby:1", "presence/alice/x", true},
				{"w", "lobby:1", "presence/bob", false},
				{"w", "lobby:1", "presence/", false},
				{"w", "lobby:1", "presence/al", false},
				{"w", "lobby:1", "presence/{sub}", false},
				{"w", "doc:1", "presence/alice", false},
				{"r", "lobby:1", "presence/alice", true},
				{"r", "lobby:1", "presence/", false},
			},
		},
		{
			name:   "{sub} in room",
			claims: &Claims{Subject: "alice", Grants: []Grant{{Room: "doc:{sub}", Access: ReadWrite}, {Room: "{sub}-{sub}", Access: Read}}},
			checks: []check{
				{"w", "doc:alice", "k", true},
				{"r", "doc:alice", "", true},
				{"w", "doc:bob", "k", false},
				{"w", "doc:{sub}", "k", false},
				{"w", "doc:alicex", "k", false},
				{"r", "alice-alice", "", true},
				{"r", "alice-bob", "", false},
			},
		},
		{
			name: "subject with a star does not widen",
			claims: &Claims{Subject: "*", Grants: []Grant{
				{Room: "doc:{sub}", Access: ReadWrite},
				{Room: "lobby", Prefix: "presence/{sub}", Access: ReadWrite},
			}},
			checks: []check{
				{"w", "doc:alice", "k", false},
				{"w", "doc:*", "k", false},
				{"r", "doc:*", "", false},
				{"w", "lobby", "presence/alice", false},
				{"w", "lobby", "presence/*", false},
			},
		},
		{
			name: "subject with braces or an empty subject matches nothing",
			claims: &Claims{Subject: "{sub}", Grants: []Grant{
				{Room: "doc:{sub}", Access: ReadWrite},
				{Room: "lobby", Prefix: "p/{sub}", Access: ReadWrite},
			}},
			checks: []check{
				{"w", "doc:{sub}", "k", false},
				{"w", "lobby", "p/{sub}", false},
				{"w", "lobby", "p/", false},
			},
		},
		{
			name: "empty subject",
			claims: &Claims{Subject: "", Grants: []Grant{
				{Room: "doc:{sub}", Access: ReadWrite},
				{Room: "lobby", Prefix: "p/{sub}", Access: ReadWrite},
			}},
			checks: []check{
				{"w", "doc:", "k", false},
				{"w", "lobby", "p/", false},
				{"w", "lobby", "p/x", false},
			},
		},
		{
			name: "subject not a room name: room grants void, prefix grants work",
			claims: &Claims{Subject: "bob/x", Grants: []Grant{
				{Room: "doc:{sub}", Access: ReadWrite},
				{Room: "lobby", Prefix: "p/{sub}", Access: Write},
			}},
			checks: []check{
				{"w", "doc:bob/x", "k", false},
				{"w", "doc:bob", "k", false},
				{"w", "lobby", "p/bob/x", true},
				{"w", "lobby", "p/bob/xy", true},
				{"w", "lobby", "p/bob", false},
			},
		},
		{
			name:   "subject with NUL in a prefix grant",
			claims: &Claims{Subject: "a\x00", Grants: []Grant{{Room: "r", Prefix: "p/{sub}", Access: Write}}},
			checks: []check{
				{"w", "r", "p/a\x00", false},
				{"w", "r", "p/a", false},
			},
		},
		{
			name:   "a grant with a void {sub} does not hide the others",
			claims: &Claims{Subject: "", Grants: []Grant{{Room: "doc:{sub}", Access: ReadWrite}, {Room: "pub", Access: Read}}},
			checks: []check{
				{"r", "pub", "", true},
				{"w", "pub", "k", false},
			},
		},
		{
			name: "access bits",
			claims: &Claims{Grants: []Grant{
				{Room: "ro", Access: Read},
				{Room: "wo", Access: Write},
				{Room: "rw", Access: ReadWrite},
				{Room: "none", Access: 0},
			}},
			checks: []check{
				{"r", "ro", "", true}, {"w", "ro", "k", false},
				{"r", "wo", "", false}, {"w", "wo", "k", true},
				{"r", "rw", "", true}, {"w", "rw", "k", true},
				{"r", "none", "", false}, {"w", "none", "k", false},
			},
		},
		{
			name: "read and write split across grants",
			claims: &Claims{Grants: []Grant{
				{Room: "g", Prefix: "a/", Access: Read},
				{Room: "g", Prefix: "b/", Access: Write},
			}},
			checks: []check{
				{"r", "g", "a/x", true}, {"w", "g", "a/x", false},
				{"r", "g", "b/x", false}, {"w", "g", "b/x", true},
			},
		},
		{
			name:   "zero claims allow nothing",
			claims: &Claims{},
			checks: []check{{"r", "r", "", false}, {"w", "r", "k", false}},
		},
		{
			name:   "nil claims allow nothing",
			claims: nil,
			checks: []check{{"r", "r", "", false}, {"w", "r", "k", false}},
		},
		{
			name:   "anonymous allows everything",
			claims: AnonymousClaims(),
			checks: []check{{"r", "any", "", true}, {"w", "doc:x", "presence/y", true}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, ck := range tc.checks {
				var got bool
				if ck.op == "r" {
					got = tc.claims.CanRead(ck.room, ck.s)
				} else {
					got = tc.claims.CanWrite(ck.room, ck.s)
				}
				if got != ck.want {
					t.Errorf("%s(%q, %q) = %v, want %v", map[string]string{"r": "CanRead", "w": "CanWrite"}[ck.op], ck.room, ck.s, got, ck.want)
				}
			}
		})
	}
}

func TestClaimsAnonymousAndExpiresIn(t *testing.T) {
	t.Parallel()
	anon := AnonymousClaims()
	want := &Claims{Expiry: authFarFuture, Grants: []Grant{{Room: "*", Prefix: "", Access: ReadWrite}}}
	if diff := cmp.Diff(want, anon); diff != "" {
		t.Errorf("AnonymousClaims (-want +got):\n%s", diff)
	}
	if d := anon.ExpiresIn(authTestNow); d < 100*365*24*time.Hour {
		t.Errorf("anonymous ExpiresIn = %v, want far future", d)
	}
	// Each call returns a fresh value: changing one does not change the next.
	anon.Grants[0].Access = 0
	if AnonymousClaims().Grants[0].Access != ReadWrite {
		t.Error("AnonymousClaims shares its grants")
	}
	c := &Claims{Expiry: authTestNow.Add(90 * time.Second)}
	if got := c.ExpiresIn(authTestNow); got != 90*time.Second {
		t.Errorf("ExpiresIn = %v, want 90s", got)
	}
	if got := c.ExpiresIn(authTestNow.Add(2 * time.Minute)); got != -30*time.Second {
		t.Errorf("ExpiresIn after expiry = %v, want -30s", got)
	}
	var nilClaims *Claims
	if got := nilClaims.ExpiresIn(authTestNow); got != 0 {
		t.Errorf("nil ExpiresIn = %v, want 0", got)
	}
}

func TestGrantAccessString(t *testing.T) {
	t.Parallel()
	for a, want := range map[Access]string{0: "", Read: "r", Write: "w", ReadWrite: "rw"} {
		if got := a.String(); got != want {
			t.Errorf("Access(%d).String() = %q, want %q", a, got, want)
		}
	}
}

// authRefGlob is a reference matcher: dynamic programming over (pattern,
// input) prefixes.
func authRefGlob(p, s string) bool {
	// m[j] reports whether p[:i] matches s[:j], for the current i.
	m := make([]bool, len(s)+1)
	m[0] = true
	for i := 0; i < len(p); i++ {
		next := make([]bool, len(s)+1)
		if p[i] == '*' {
			next[0] = m[0]
			for j := 1; j <= len(s); j++ {
				next[j] = m[j] || next[j-1]
			}
		} else {
			for j := 1; j <= len(s); j++ {
				next[j] = m[j-1] && p[i] == s[j-1]
			}
		}
		m = next
	}
	return m[len(s)]
}

func TestGrantGlobMatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p, s string
		want bool
	}{
		{"", "", true},
		{"", "a", false},
		{"*", "", true},
		{"*", "abc", true},
		{"**", "abc", true},
		{"a*", "a", true},
		{"a*", "ab", true},
		{"a*", "ba", false},
		{"*a", "ba", true},
		{"*a", "ab", false},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"a*a", "aba", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "acb", false},
		{"*ab*ab*", "abab", true},
		{"*ab*ab*", "aab", false},
		{"lobby:*", "lobby:", true},
		{"x*y", "xy", true},
		{"x*y*", "xzy", true},
		{"?", "a", false},
		{"[a]", "a", false},
		{"a.b", "axb", false},
		{"*", strings.Repeat("a", authMaxMatchInput+1), false},
	} {
		if got := authGlobMatch(tc.p, tc.s); got != tc.want {
			t.Errorf("authGlobMatch(%q, %q) = %v, want %v", tc.p, tc.s, got, tc.want)
		}
	}
}

// TestGrantGlobMatchesReference compares the matcher with the reference on
// every pattern over {a, b, *} up to 6 bytes and every input over {a, b} up
// to 7 bytes.
func TestGrantGlobMatchesReference(t *testing.T) {
	t.Parallel()
	all := func(alphabet string, maxLen int) []string {
		out := []string{""}
		level := []string{""}
		for range maxLen {
			var next []string
			for _, w := range level {
				for _, c := range alphabet {
					next = append(next, w+string(c))
				}
			}
			out = append(out, next...)
			level = next
		}
		return out
	}
	inputs := all("ab", 7)
	for _, p := range all("ab*", 6) {
		for _, s := range inputs {
			if got, want := authGlobMatch(p, s), authRefGlob(p, s); got != want {
				t.Fatalf("authGlobMatch(%q, %q) = %v, reference says %v", p, s, got, want)
			}
		}
	}
}

// TestGrantGlobNoBlowup runs the inputs that make backtracking matchers
// exponential and regexp-free naive ones quadratic or worse.
func TestGrantGlobNoBlowup(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("a", authMaxMatchInput)
	p := strings.Repeat("*a", authMaxRoomPattern/2-1) + "*b"
	start := time.Now()
	for range 100 {
		if authGlobMatch(p, s) {
			t.Fatal("matched")
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("100 adversarial matches took %v", d)
	}
	// The same through CanRead, with a room pattern as long as a token allows.
	c := &Claims{Grants: []Grant{{Room: p, Access: Read}}}
	if c.CanRead(s, "") {
		t.Fatal("CanRead matched")
	}
	if c.CanRead(strings.Repeat("a", 1<<20), "") {
		t.Fatal("CanRead matched a 1 MiB room")
	}
}

func FuzzGrantGlob(f *testing.F) {
	for _, seed := range [][2]string{{"*", ""}, {"a*b*c", "aXbYc"}, {"*ab*ab*", "abab"}, {"lobby:*", "lobby:eu"}} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, p, s string) {
		if len(p) > 64 || len(s) > 256 {
			return // keep the quadratic reference quick
		}
		if got, want := authGlobMatch(p, s), authRefGlob(p, s); got != want {
			t.Fatalf("authGlobMatch(%q, %q) = %v, reference says %v", p, s, got, want)
		}
	})
}

// FuzzVerify checks that Verify never panics, that every error is one of
// the sentinels, and that it never returns claims for a token whose
// signature does not verify with the configured keys (checked here
// independently of the jwt library).
func FuzzVerify(f *testing.F) {
	secret := []byte("fuzz-secret-fuzz-secret-fuzz-secret!")
	edKey := ed25519.NewKeyFromSeed([]byte("0123456789abcdef0123456789abcdef"))
	edPub := edKey.Public().(ed25519.PublicKey)
	a := authTestNew(f, AuthConfig{HMACSecret: secret, PublicKeyPEM: authTestPEM(f, edPub)})

	payload, err := json.Marshal(authTestClaims(nil))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		authTestSign(f, jwt.SigningMethodHS256, secret, authTestClaims(nil)),
		authTestSign(f, jwt.SigningMethodEdDSA, edKey, authTestClaims(nil)),
		authTestSign(f, jwt.SigningMethodHS256, secret, authTestClaims(jwt.MapClaims{"sub": "*", "statecast": map[string]any{"grants": []any{map[string]any{"room": "{sub}", "prefix": "{sub}", "access": "rw"}}}})),
		authTestSign(f, jwt.SigningMethodHS256, secret, authTestClaims(jwt.MapClaims{"exp": authTestNow.Add(-time.Hour).Unix()})),
		authTestSign(f, jwt.SigningMethodHS384, secret, authTestClaims(nil)),
		authTestSign(f, jwt.SigningMethodHS256, []byte("another-secret-another-secret-!!"), authTestClaims(nil)),
		authTestRaw(`{"alg":"none"}`, string(payload), nil),
		authTestRaw(`{"alg":"HS256"}`, `{"exp":1e400}`, []byte("sig")),
		"", "garbage", "...", "a.b.c", "e30.e30.",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		claims, err := a.Verify(token)
		if err != nil {
			if claims != nil {
				t.Fatalf("claims %+v with error %v", claims, err)
			}
			known := false
			for _, s := range authTestSentinels {
				known = known || errors.Is(err, s)
			}
			if !known {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			if len(token) >= 16 && strings.Contains(err.Error(), token) {
				t.Fatalf("error message contains the token: %v", err)
			}
			return
		}
		if claims == nil {
			t.Fatal("nil claims without error")
		}
		parts := strings.Split(token, ".")
		if len(parts) != 3 {
			t.Fatalf("accepted a token of %d segments", len(parts))
		}
		sig, err := base64.RawURLEncoding.Strict().DecodeString(parts[2])
		if err != nil {
			t.Fatalf("accepted a token whose signature does not decode: %v", err)
		}
		signed := []byte(parts[0] + "." + parts[1])
		mac := hmac.New(sha256.New, secret)
		mac.Write(signed)
		if !hmac.Equal(sig, mac.Sum(nil)) && !ed25519.Verify(edPub, signed, sig) {
			t.Fatalf("accepted a token not signed with the configured keys")
		}
		// Whatever the claims hold, matching must not panic.
		for _, g := range claims.Grants {
			claims.CanRead(g.Room, g.Prefix)
			claims.CanWrite(g.Room, g.Prefix+"x")
		}
		claims.CanRead(claims.Subject, claims.Subject)
		claims.CanWrite("doc:"+claims.Subject, "presence/"+claims.Subject)
	})
}

// TestVerifyTimeClaimMessages: a time claim that is no NumericDate is
// named in the message, and a huge exp is not reported as expired.
func TestVerifyTimeClaimMessages(t *testing.T) {
	t.Parallel()
	k := authTestKeys()
	a := authTestNew(t, AuthConfig{HMACSecret: k.secret})
	for _, tc := range []struct {
		extra jwt.MapClaims
		want  string
	}{
		{jwt.MapClaims{"exp": "1767225600"}, "exp must be a JSON number"},
		{jwt.MapClaims{"iat": "1767225600"}, "iat must be a JSON number"},
		{jwt.MapClaims{"exp": 1e20}, "invalid exp"},
		{jwt.MapClaims{"nbf": 1e20}, "invalid nbf"},
	} {
		_, err := a.Verify(authTestSign(t, jwt.SigningMethodHS256, k.secret, authTestClaims(tc.extra)))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "expired") {
			t.Errorf("%v: %v, want a message with %q", tc.extra, err, tc.want)
		}
	}
}
