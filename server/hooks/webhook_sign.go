package hooks

import (
	"fmt"
	"io"
	"net/http"
	"time"
)

// A webhook POST is signed as every hook request is (sign.go:
// SignatureHeader, Stripe's scheme), and carries two headers of its own.
const (
	// DeliveryHeader is the idempotency key of a delivery:
	// "<room>@<epoch>:<from>-<to>" for revisions, "<room>@<epoch>:snapshot-<rev>"
	// for a snapshot.
	DeliveryHeader = "Statecast-Delivery"
	// HookHeader names the webhook (WebhookID) that sent the delivery.
	HookHeader = "Statecast-Hook"
)

// VerifyRequest reads r's body (at most maxBytes; <= 0: 64 MiB) and
// verifies its signature with VerifySignature at the current time, for a
// webhook receiver written in Go. It returns the body, to be decoded only
// when the error is nil.
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
	return body, VerifySignature(secret, r.Header.Get(SignatureHeader), body, tolerance, time.Now())
}
