package auth

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
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

func TestVerifyValidTokens(t *testing.T) {
	t.Parallel()
	k := testKeys()
	all := testPEM(t, &k.rsa.PublicKey, &k.ec256.PublicKey, &k.ec384.PublicKey, &k.ec521.PublicKey, k.ed.Public())
	certPEM := func() []byte {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.ed.Public(), k.ed)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}()
	pkcs1PEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey)})

	for _, tc := range []struct {
		name   string
		cfg    Config
		method jwt.SigningMethod
		key    any
	}{
		{"HS256", Config{HMACSecret: k.secret}, jwt.SigningMethodHS256, k.secret},
		{"HS384", Config{HMACSecret: k.secret, Algorithms: []string{"HS384"}}, jwt.SigningMethodHS384, k.secret},
		{"HS512", Config{HMACSecret: k.secret, Algorithms: []string{"HS256", "HS512"}}, jwt.SigningMethodHS512, k.secret},
		{"RS256", Config{PublicKeyPEM: testPEM(t, &k.rsa.PublicKey)}, jwt.SigningMethodRS256, k.rsa},
		{"RS256 PKCS1 PEM", Config{PublicKeyPEM: pkcs1PEM}, jwt.SigningMethodRS256, k.rsa},
		{"RS512", Config{PublicKeyPEM: testPEM(t, &k.rsa.PublicKey), Algorithms: []string{"RS512"}}, jwt.SigningMethodRS512, k.rsa},
		{"PS256", Config{PublicKeyPEM: testPEM(t, &k.rsa.PublicKey), Algorithms: []string{"PS256"}}, jwt.SigningMethodPS256, k.rsa},
		{"ES256", Config{PublicKeyPEM: testPEM(t, &k.ec256.PublicKey)}, jwt.SigningMethodES256, k.ec256},
		{"ES384", Config{PublicKeyPEM: testPEM(t, &k.ec384.PublicKey)}, jwt.SigningMethodES384, k.ec384},
		{"ES512", Config{PublicKeyPEM: testPEM(t, &k.ec521.PublicKey)}, jwt.SigningMethodES512, k.ec521},
		{"EdDSA", Config{PublicKeyPEM: testPEM(t, k.ed.Public())}, jwt.SigningMethodEdDSA, k.ed},
		{"EdDSA from certificate", Config{PublicKeyPEM: certPEM}, jwt.SigningMethodEdDSA, k.ed},
		{"several PEM blocks: RSA", Config{PublicKeyPEM: all}, jwt.SigningMethodRS256, k.rsa},
		{"several PEM blocks: ES256", Config{PublicKeyPEM: all}, jwt.SigningMethodES256, k.ec256},
		{"several PEM blocks: ES512", Config{PublicKeyPEM: all}, jwt.SigningMethodES512, k.ec521},
		{"several PEM blocks: EdDSA", Config{PublicKeyPEM: all}, jwt.SigningMethodEdDSA, k.ed},
		{"second of two RSA keys", Config{PublicKeyPEM: testPEM(t, &k.rsa2.PublicKey, &k.rsa.PublicKey)}, jwt.SigningMethodRS256, k.rsa},
		{"HMAC and RSA together: HS256", Config{HMACSecret: k.secret, PublicKeyPEM: testPEM(t, &k.rsa.PublicKey)}, jwt.SigningMethodHS256, k.secret},
		{"HMAC and RSA together: RS256", Config{HMACSecret: k.secret, PublicKeyPEM: testPEM(t, &k.rsa.PublicKey)}, jwt.SigningMethodRS256, k.rsa},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := testNew(t, tc.cfg)
			tok := testSign(t, tc.method, tc.key, testClaims(nil))
			got, err := a.Verify(tok)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if diff := cmp.Diff(testWantClaims(), got); diff != "" {
				t.Errorf("claims (-want +got):\n%s", diff)
			}
		})
	}
}

func TestVerifyIssuerAudienceAccepted(t *testing.T) {
	t.Parallel()
	k := testKeys()
	a := testNew(t, Config{HMACSecret: k.secret, Issuer: "https://issuer.example", Audience: "statecast"})
	for _, aud := range []any{"statecast", []any{"other", "statecast"}} {
		tok := testSign(t, jwt.SigningMethodHS256, k.secret, testClaims(jwt.MapClaims{"iss": "https://issuer.example", "aud": aud}))
		if _, err := a.Verify(tok); err != nil {
			t.Errorf("aud %v: Verify: %v", aud, err)
		}
	}
}

func TestVerifyRejects(t *testing.T) {
	t.Parallel()
	k := testKeys()
	rsaPEM := testPEM(t, &k.rsa.PublicKey)
	hsCfg := Config{HMACSecret: k.secret}
	rsaCfg := Config{PublicKeyPEM: rsaPEM}
	edCfg := Config{PublicKeyPEM: testPEM(t, k.ed.Public())}
	ecCfg := Config{PublicKeyPEM: testPEM(t, &k.ec256.PublicKey)}
	issCfg := Config{HMACSecret: k.secret, Issuer: "https://issuer.example", Audience: "statecast"}
	hs := func(extra jwt.MapClaims) string {
		return testSign(t, jwt.SigningMethodHS256, k.secret, testClaims(extra))
	}
	grants := func(gs ...any) string {
		return hs(jwt.MapClaims{"statecast": map[string]any{"grants": gs}})
	}
	payload, err := json.Marshal(testClaims(nil))
	if err != nil {
		t.Fatal(err)
	}
	valid := hs(nil)
	parts := strings.Split(valid, ".")

	// The classic key confusion: an HS256 token whose HMAC key is the RSA
	// public key as the server holds it.
	confused := testSign(t, jwt.SigningMethodHS256, rsaPEM, testClaims(nil))
	// The same with the DER bytes, for servers that would keep those.
	der, err := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	confusedDER := testSign(t, jwt.SigningMethodHS256, der, testClaims(nil))

	// An RS256 signature on the payload, relabelled as PS256: right key,
	// wrong algorithm.
	rs := testSign(t, jwt.SigningMethodRS256, k.rsa, testClaims(nil))
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

	huge := testSign(t, jwt.SigningMethodHS256, k.secret, testClaims(jwt.MapClaims{"pad": strings.Repeat("x", 1<<20)}))

	tooMany := make([]any, maxGrants+1)
	for i := range tooMany {
		tooMany[i] = map[string]any{"room": "r", "access": "r"}
	}

	for _, tc := range []struct {
		name  string
		cfg   Config
		token string
		want  error
	}{
		// Signatures and algorithms.
		{"HS256 other secret", hsCfg, testSign(t, jwt.SigningMethodHS256, k.secret2, testClaims(nil)), ErrTokenSignature},
		{"HS256 tampered payload", hsCfg, parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), `"alice"`, `"admin"`, 1))) + "." + parts[2], ErrTokenSignature},
		{"HS256 signature stripped", hsCfg, parts[0] + "." + parts[1] + ".", ErrTokenSignature},
		{"HS256 non-canonical base64 signature", hsCfg, malleated, ErrTokenMalformed},
		{"RS256 other key", rsaCfg, testSign(t, jwt.SigningMethodRS256, k.rsa2, testClaims(nil)), ErrTokenSignature},
		{"ES256 other key", ecCfg, testSign(t, jwt.SigningMethodES256, k.ec256b, testClaims(nil)), ErrTokenSignature},
		{"EdDSA other key", edCfg, testSign(t, jwt.SigningMethodEdDSA, k.ed2, testClaims(nil)), ErrTokenSignature},
		{"alg none, HMAC configured", hsCfg, testRaw(`{"alg":"none"}`, string(payload), nil), ErrTokenSignature},
		{"alg none, RSA configured", rsaCfg, testRaw(`{"alg":"none","typ":"JWT"}`, string(payload), nil), ErrTokenSignature},
		{"alg NONE", hsCfg, testRaw(`{"alg":"NONE"}`, string(payload), nil), ErrTokenSignature},
		{"alg missing", hsCfg, testRaw(`{"typ":"JWT"}`, string(payload), []byte("x")), ErrTokenSignature},
		{"alg unknown", hsCfg, testRaw(`{"alg":"HS1024"}`, string(payload), []byte("x")), ErrTokenSignature},
		{"key confusion: HS256 with RSA PEM as secret", rsaCfg, confused, ErrTokenSignature},
		{"key confusion: HS256 with RSA DER as secret", rsaCfg, confusedDER, ErrTokenSignature},
		{"RS256 when only HS256 allowed", hsCfg, rs, ErrTokenSignature},
		{"RS256 relabelled PS256", rsaCfg, relabelled, ErrTokenSignature},
		{"ES384 token, only P-256 configured", ecCfg, testSign(t, jwt.SigningMethodES384, k.ec384, testClaims(nil)), ErrTokenSignature},
		{"HS384 token, only HS256 allowed", hsCfg, testSign(t, jwt.SigningMethodHS384, k.secret, testClaims(nil)), ErrTokenSignature},
		{"EdDSA token, only RSA configured", rsaCfg, testSign(t, jwt.SigningMethodEdDSA, k.ed, testClaims(nil)), ErrTokenSignature},

		// Time.
		{"expired", hsCfg, hs(jwt.MapClaims{"exp": testNow.Add(-time.Minute).Unix()}), ErrTokenExpired},
		{"expired beyond leeway", hsCfg, hs(jwt.MapClaims{"exp": testNow.Add(-6 * time.Second).Unix()}), ErrTokenExpired},
		{"expired, no leeway", Config{HMACSecret: k.secret, Leeway: -1}, hs(jwt.MapClaims{"exp": testNow.Add(-time.Second).Unix()}), ErrTokenExpired},
		{"no sub", hsCfg, hs(jwt.MapClaims{"sub": nil}), ErrTokenClaims},
		{"empty sub", hsCfg, hs(jwt.MapClaims{"sub": ""}), ErrTokenClaims},
		{"nbf in the future", hsCfg, hs(jwt.MapClaims{"nbf": testNow.Add(time.Minute).Unix()}), ErrTokenNotYetValid},
		{"nbf beyond leeway", hsCfg, hs(jwt.MapClaims{"nbf": testNow.Add(6 * time.Second).Unix()}), ErrTokenNotYetValid},
		{"nbf beyond a larger leeway", Config{HMACSecret: k.secret, Leeway: time.Minute}, hs(jwt.MapClaims{"nbf": testNow.Add(61 * time.Second).Unix()}), ErrTokenNotYetValid},
		{"iat in the future", hsCfg, hs(jwt.MapClaims{"iat": testNow.Add(time.Hour).Unix()}), ErrTokenNotYetValid},

		// Registered claims.
		{"missing exp", hsCfg, hs(jwt.MapClaims{"exp": nil}), ErrTokenClaims},
		{"wrong iss", issCfg, hs(jwt.MapClaims{"iss": "https://evil.example", "aud": "statecast"}), ErrTokenClaims},
		{"missing iss", issCfg, hs(jwt.MapClaims{"aud": "statecast"}), ErrTokenClaims},
		{"wrong aud", issCfg, hs(jwt.MapClaims{"iss": "https://issuer.example", "aud": "other"}), ErrTokenClaims},
		{"wrong aud list", issCfg, hs(jwt.MapClaims{"iss": "https://issuer.example", "aud": []string{"a", "b"}}), ErrTokenClaims},
		{"missing aud", issCfg, hs(jwt.MapClaims{"iss": "https://issuer.example"}), ErrTokenClaims},
		{"wrong iss and expired", issCfg, hs(jwt.MapClaims{"iss": "x", "aud": "statecast", "exp": testNow.Add(-time.Hour).Unix()}), ErrTokenClaims},
		{"exp of the wrong type", hsCfg, hs(jwt.MapClaims{"exp": "tomorrow"}), ErrTokenMalformed},
		{"exp a numeric string", hsCfg, hs(jwt.MapClaims{"exp": fmt.Sprint(testNow.Add(time.Hour).Unix())}), ErrTokenMalformed},
		{"nbf a numeric string", hsCfg, hs(jwt.MapClaims{"nbf": fmt.Sprint(testNow.Unix())}), ErrTokenMalformed},
		{"iat a numeric string", hsCfg, hs(jwt.MapClaims{"iat": fmt.Sprint(testNow.Unix())}), ErrTokenMalformed},
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
		{"room too long", hsCfg, grants(map[string]any{"room": strings.Repeat("a", maxRoomPattern+1), "access": "r"}), ErrTokenClaims},
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
		{"header not JSON", hsCfg, testRaw(`alg`, string(payload), nil), ErrTokenMalformed},
		{"payload not JSON", hsCfg, testRaw(`{"alg":"HS256"}`, `{`, nil), ErrTokenMalformed},
		{"payload an array", hsCfg, testRaw(`{"alg":"HS256"}`, `[1]`, nil), ErrTokenMalformed},
		{"crit header", hsCfg, crit, ErrTokenMalformed},
		{"huge (1 MiB)", hsCfg, huge, ErrTokenMalformed},
		{"huge garbage", hsCfg, strings.Repeat("a.", 1<<19), ErrTokenMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := testNew(t, tc.cfg)
			got, err := a.Verify(tc.token)
			testCheckRejected(t, tc.token, got, err, tc.want)
		})
	}
}

func TestVerifyLeewayAccepts(t *testing.T) {
	t.Parallel()
	k := testKeys()
	a := testNew(t, Config{HMACSecret: k.secret})
	for name, extra := range map[string]jwt.MapClaims{
		"exp 4s ago":     {"exp": testNow.Add(-4 * time.Second).Unix()},
		"nbf in 4s":      {"nbf": testNow.Add(4 * time.Second).Unix()},
		"iat in 4s":      {"iat": testNow.Add(4 * time.Second).Unix()},
		"nbf now":        {"nbf": testNow.Unix()},
		"no iat":         {"iat": nil},
		"no grants":      {"statecast": nil},
		"null grants":    {"statecast": map[string]any{"grants": nil}},
		"empty claim":    {"statecast": map[string]any{}},
		"exp in a year":  {"exp": testNow.AddDate(1, 0, 0).Unix()},
		"exp in 9999":    {"exp": 253402300799},
		"exp fractional": {"exp": float64(testNow.Unix()) + 0.5},
	} {
		tok := testSign(t, jwt.SigningMethodHS256, k.secret, testClaims(extra))
		if _, err := a.Verify(tok); err != nil {
			t.Errorf("%s: Verify: %v", name, err)
		}
	}
}

func TestVerifyHugeTokenIsFast(t *testing.T) {
	t.Parallel()
	k := testKeys()
	a := testNew(t, Config{PublicKeyPEM: testPEM(t, &k.rsa.PublicKey)})
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
	testCheckRejected(t, "a.b.c", got, err, ErrTokenSignature)
}

func TestVerifyConcurrent(t *testing.T) {
	t.Parallel()
	k := testKeys()
	a := testNew(t, Config{HMACSecret: k.secret, PublicKeyPEM: testPEM(t, k.ed.Public())})
	good := []string{
		testSign(t, jwt.SigningMethodHS256, k.secret, testClaims(nil)),
		testSign(t, jwt.SigningMethodEdDSA, k.ed, testClaims(nil)),
	}
	bad := testSign(t, jwt.SigningMethodEdDSA, k.ed2, testClaims(nil))
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
	k := testKeys()
	a := testNew(t, Config{HMACSecret: k.secret})
	payload := `{"sub":"alice","exp":` + fmt.Sprint(testNow.Add(time.Hour).Unix()) + `,
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
	if diff := cmp.Diff(testWantClaims(), c); diff != "" {
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

// FuzzVerify checks that Verify never panics, that every error is one of
// the sentinels, and that it never returns claims for a token whose
// signature does not verify with the configured keys (checked here
// independently of the jwt library).
func FuzzVerify(f *testing.F) {
	secret := []byte("fuzz-secret-fuzz-secret-fuzz-secret!")
	edKey := ed25519.NewKeyFromSeed([]byte("0123456789abcdef0123456789abcdef"))
	edPub := edKey.Public().(ed25519.PublicKey)
	a := testNew(f, Config{HMACSecret: secret, PublicKeyPEM: testPEM(f, edPub)})

	payload, err := json.Marshal(testClaims(nil))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		testSign(f, jwt.SigningMethodHS256, secret, testClaims(nil)),
		testSign(f, jwt.SigningMethodEdDSA, edKey, testClaims(nil)),
		testSign(f, jwt.SigningMethodHS256, secret, testClaims(jwt.MapClaims{"sub": "*", "statecast": map[string]any{"grants": []any{map[string]any{"room": "{sub}", "prefix": "{sub}", "access": "rw"}}}})),
		testSign(f, jwt.SigningMethodHS256, secret, testClaims(jwt.MapClaims{"exp": testNow.Add(-time.Hour).Unix()})),
		testSign(f, jwt.SigningMethodHS384, secret, testClaims(nil)),
		testSign(f, jwt.SigningMethodHS256, []byte("another-secret-another-secret-!!"), testClaims(nil)),
		testRaw(`{"alg":"none"}`, string(payload), nil),
		testRaw(`{"alg":"HS256"}`, `{"exp":1e400}`, []byte("sig")),
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
			for _, s := range testSentinels {
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
	k := testKeys()
	a := testNew(t, Config{HMACSecret: k.secret})
	for _, tc := range []struct {
		extra jwt.MapClaims
		want  string
	}{
		{jwt.MapClaims{"exp": "1767225600"}, "exp must be a JSON number"},
		{jwt.MapClaims{"iat": "1767225600"}, "iat must be a JSON number"},
		{jwt.MapClaims{"exp": 1e20}, "invalid exp"},
		{jwt.MapClaims{"nbf": 1e20}, "invalid nbf"},
	} {
		_, err := a.Verify(testSign(t, jwt.SigningMethodHS256, k.secret, testClaims(tc.extra)))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "expired") {
			t.Errorf("%v: %v, want a message with %q", tc.extra, err, tc.want)
		}
	}
}
