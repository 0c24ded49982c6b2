package hooks_test

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/statecast/statecast/server/hooks"
)

func TestVerifyRequest(t *testing.T) {
	body := []byte(`{"room":"doc:1"}`)
	good := hooks.Sign(secret, body, time.Now())
	for _, c := range []struct {
		name     string
		body     []byte
		header   string
		max      int64
		wantErr  error
		wantBody bool
	}{
		{"signed", body, good, 0, nil, true},
		{"body changed", []byte(`{"room":"doc:2"}`), good, 0, hooks.ErrSignature, false},
		{"unsigned", body, "", 0, hooks.ErrSignature, false},
		{"too large", body, good, 4, nil, false},
	} {
		r := httptest.NewRequest("POST", "/", bytes.NewReader(c.body))
		r.Header.Set(hooks.SignatureHeader, c.header)
		got, err := hooks.VerifyRequest(r, secret, 0, c.max)
		switch {
		case c.wantBody && (err != nil || !bytes.Equal(got, body)):
			t.Errorf("%s: %q, %v", c.name, got, err)
		case !c.wantBody && err == nil:
			t.Errorf("%s: accepted", c.name)
		case c.wantErr != nil && !errors.Is(err, c.wantErr):
			t.Errorf("%s: %v, want %v", c.name, err, c.wantErr)
		}
	}
}
