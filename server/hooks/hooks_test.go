package hooks

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSignature: a signed body verifies; a changed body, another secret,
// an old timestamp (a replay) or a missing header do not; one matching v1
// among several (a rotation) is enough.
func TestSignature(t *testing.T) {
	secret, body := []byte("s3cret"), []byte(`{"room":"game:1"}`)
	now := time.Unix(1_800_000_000, 0)
	h := Sign(secret, body, now)
	if !strings.HasPrefix(h, "t=1800000000,v1=") {
		t.Fatalf("header %q", h)
	}
	if err := VerifySignature(secret, h, body, 0, now.Add(time.Minute)); err != nil {
		t.Errorf("a good signature: %v", err)
	}
	other := Sign([]byte("old"), body, now)
	if err := VerifySignature(secret, other+",v1="+strings.TrimPrefix(h, "t=1800000000,v1="), body, 0, now); err != nil {
		t.Errorf("rotation, one v1 matching: %v", err)
	}
	for name, c := range map[string]struct {
		header string
		body   []byte
		at     time.Time
	}{
		"changed body":    {h, []byte(`{"room":"game:2"}`), now},
		"other secret":    {other, body, now},
		"replayed":        {h, body, now.Add(DefaultTolerance + time.Second)},
		"from the future": {h, body, now.Add(-DefaultTolerance - time.Second)},
		"missing":         {"", body, now},
		"no v1":           {"t=1800000000", body, now},
		"timestamp swap":  {strings.Replace(h, "t=1800000000", "t=1800000001", 1), body, now},
	} {
		if err := VerifySignature(secret, c.header, c.body, 0, c.at); !errors.Is(err, ErrSignature) {
			t.Errorf("%s: %v, want ErrSignature", name, err)
		}
	}
}

// TestRoutes: PATTERN=URL specs, the first matching route wins, and bad
// specs are refused with what is wrong.
func TestRoutes(t *testing.T) {
	rs, err := ParseRoutes([]string{"game:vip-*=http://a/v", "game:*=https://b/v?x=1", "doc:*:draft=http://c/"})
	if err != nil {
		t.Fatal(err)
	}
	for room, want := range map[string]string{
		"game:vip-7": "http://a/v", "game:7": "https://b/v?x=1", "doc:1:draft": "http://c/", "doc:1": "", "lobby:game:1": "",
	} {
		r, ok := rs.Match(room)
		if r.URL != want || ok != (want != "") {
			t.Errorf("%s: %+v %v, want %q", room, r, ok, want)
		}
	}
	for _, bad := range []string{"game:*", "=http://a", "game:*=", "game:{sub}=http://a", "game/x=http://a", "game:*=ftp://a", "game:*=/relative"} {
		if _, err := ParseRoute(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestConnectReply: a 200 reply becomes claims only when it is one: a
// subject, grants by the token rules, expires_in bounded.
func TestConnectReply(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	c, err := NewConnector(ConnectorConfig{URL: "http://127.0.0.1:1/", Secret: []byte("s"), Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := c.claims([]byte(`{"subject":"al","grants":[{"room":"doc:{sub}","prefix":"p/","access":"rw"}],"expires_in":90}`))
	if err != nil || cl.Subject != "al" || len(cl.Grants) != 1 || !cl.CanWrite("doc:al", "p/x") || cl.CanWrite("doc:bo", "p/x") ||
		!cl.Expiry.Equal(now.Add(90*time.Second)) {
		t.Errorf("claims %+v, %v", cl, err)
	}
	if cl, err := c.claims([]byte(`{"subject":"al","expires_in":1e300}`)); err != nil || !cl.Expiry.Equal(now.Add(maxExpiresIn)) || len(cl.Grants) != 0 {
		t.Errorf("huge expires_in, no grants: %+v, %v", cl, err)
	}
	for _, bad := range []string{`{"grants":[]}`, `{"subject":"al","grants":[{"room":"doc:*","access":"x"}]}`,
		`{"subject":"al","grants":[{"room":"doc:*","access":"r","prefx":"a"}]}`, `not json`} {
		if _, err := c.claims([]byte(bad)); !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: %v, want ErrUnavailable", bad, err)
		}
	}
}
