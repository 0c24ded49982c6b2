package hooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries a request's signature: "t=<unix seconds>,
// v1=<hex HMAC-SHA256 of "<t>." + body under the secret>" (the scheme
// of Stripe's webhooks). Several v1 entries may be given (a sender in the
// middle of a secret rotation); one matching is enough.
const SignatureHeader = "Statecast-Signature"

// DefaultTolerance is how far a signature's timestamp may lie from the
// receiver's clock in VerifySignature: older requests are replays.
const DefaultTolerance = 5 * time.Minute

// ErrSignature: a request's signature is missing, malformed, does not
// match its body, or is too old (a replay) or too far in the future.
var ErrSignature = errors.New("hooks: bad signature")

// Sign returns the SignatureHeader value of body sent at t.
func Sign(secret, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

// mac is HMAC-SHA256 over "<ts>." + body.
func mac(secret []byte, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// VerifySignature checks header (SignatureHeader's value) against body:
// some v1 must be the HMAC of its timestamp and body under secret, and the
// timestamp within tolerance of now (DefaultTolerance when zero). A
// backend written in Go verifies each request with it before reading it:
//
//	body, _ := io.ReadAll(r.Body)
//	if err := hooks.VerifySignature(secret, r.Header.Get(hooks.SignatureHeader), body, 0, time.Now()); err != nil {
//		http.Error(w, "forbidden", http.StatusForbidden)
//		return
//	}
func VerifySignature(secret []byte, header string, body []byte, tolerance time.Duration, now time.Time) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			if sig, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return fmt.Errorf("%w: want %q with t=<unix seconds>,v1=<hex>", ErrSignature, SignatureHeader)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp %d is %v from now (tolerance %v)", ErrSignature, sec, d.Round(time.Second), tolerance)
	}
	want := mac(secret, ts, body)
	for _, sig := range sigs {
		if hmac.Equal(sig, want) {
			return nil
		}
	}
	return fmt.Errorf("%w: no v1 matches the body", ErrSignature)
}
