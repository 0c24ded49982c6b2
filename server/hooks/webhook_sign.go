package hooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The signature scheme, as Stripe's: the header
//
//	Statecast-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, t + "." + body)>
//
// signs the body together with the time it was sent, so a receiver that
// checks the MAC and that t is recent rejects both a forged body and a
// captured request replayed later. Within the tolerance a replay is an
// exact duplicate of a delivery, which the receiver drops by its
// idempotency key (Statecast-Delivery: the room, epoch and revisions).
const (
	// SignatureHeader carries the timestamp and the MAC.
	SignatureHeader = "Statecast-Signature"
	// DeliveryHeader is the idempotency key of a delivery:
	// "<room>@<epoch>:<from>-<to>" for revisions, "<room>@<epoch>:snapshot-<rev>"
	// for a snapshot.
	DeliveryHeader = "Statecast-Delivery"
	// HookHeader names the hook (its id) that sent the delivery.
	HookHeader = "Statecast-Hook"
	// DefaultTolerance is how old a signature Verify accepts by default.
	DefaultTolerance = 5 * time.Minute
)

// Verification errors; test with errors.Is.
var (
	ErrNoSignature  = errors.New("hooks: missing or malformed " + SignatureHeader)
	ErrBadSignature = errors.New("hooks: signature does not match the body")
	ErrStale        = errors.New("hooks: signature timestamp outside the tolerance (replay?)")
)

// Sign returns the Statecast-Signature header value for body sent at t.
func Sign(secret, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify checks a Statecast-Signature header against body: one of its v1
// MACs must be HMAC-SHA256(secret, t + "." + body), and t within tolerance
// of now (tolerance <= 0: DefaultTolerance). The comparison is in constant
// time.
func Verify(secret []byte, header string, body []byte, tolerance time.Duration, now time.Time) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			if b, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, b)
			}
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrNoSignature
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed %s ago", ErrStale, d.Round(time.Second))
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return nil
		}
	}
	return ErrBadSignature
}

// VerifyRequest reads r's body (at most maxBytes; <= 0: 64 MiB) and
// verifies its signature with Verify at the current time. It returns the
// body, to be decoded only when the error is nil.
func VerifyRequest(r *http.Request, secret []byte, tolerance time.Duration, maxBytes int64) ([]byte, error) {
	if maxBytes <= 0 {
		maxBytes = 64 << 20
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > maxBytes {
		return nil, fmt.Errorf("hooks: body larger than %d bytes", maxBytes)
	}
	return body, Verify(secret, r.Header.Get(SignatureHeader), body, tolerance, time.Now())
}
