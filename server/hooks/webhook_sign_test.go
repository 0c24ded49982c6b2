package hooks_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/server/hooks"
)

func TestVerifyRejectsForgeriesAndReplays(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"room":"doc:1"}`)
	good := hooks.Sign(secret, body, now)
	if err := hooks.Verify(secret, good, body, 0, now.Add(time.Minute)); err != nil {
		t.Fatalf("a good signature: %v", err)
	}
	cases := []struct {
		name   string
		header string
		body   []byte
		at     time.Time
		want   error
	}{
		{"body changed", good, []byte(`{"room":"doc:2"}`), now, hooks.ErrBadSignature},
		{"other secret", hooks.Sign([]byte("other"), body, now), body, now, hooks.ErrBadSignature},
		{"timestamp changed", strings.Replace(good, "t=1800000000", "t=1800000001", 1), body, now, hooks.ErrBadSignature},
		{"replayed later", good, body, now.Add(6 * time.Minute), hooks.ErrStale},
		{"from the future", good, body, now.Add(-6 * time.Minute), hooks.ErrStale},
		{"no header", "", body, now, hooks.ErrNoSignature},
		{"no mac", "t=1800000000", body, now, hooks.ErrNoSignature},
	}
	for _, c := range cases {
		if err := hooks.Verify(secret, c.header, c.body, 0, c.at); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// A receiver rotating secrets accepts either MAC.
	two := good + ",v1=" + strings.Repeat("00", 32)
	if err := hooks.Verify(secret, two, body, 0, now); err != nil {
		t.Errorf("two MACs, one good: %v", err)
	}
}
