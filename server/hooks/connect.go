package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/statecast/statecast/server/auth"
)

// ErrRefused: the connect hook answered 401 or 403: the client is not
// let in, as with a bad token.
var ErrRefused = errors.New("hooks: the backend refused the connection")

// ForwardedHeaders are the request header fields a node passes to the
// connect hook: the application's own session credentials.
var ForwardedHeaders = []string{"Cookie", "Authorization"}

// ConnectRequest is the body a node POSTs to the connect hook, with the
// client's ForwardedHeaders as header fields of the POST.
type ConnectRequest struct {
	// Transport is "websocket" or "http".
	Transport string `json:"transport"`
	// Addr is the client's address as the node sees it.
	Addr string `json:"addr"`
}

// connectReply is the connect hook's 200 answer.
type connectReply struct {
	Subject   string          `json:"subject"`
	Grants    json.RawMessage `json:"grants"`
	ExpiresIn float64         `json:"expires_in"` // seconds
}

const (
	// defaultExpiresIn is how long claims without expires_in last.
	defaultExpiresIn = time.Hour
	// maxExpiresIn bounds it: a session then asks the backend again.
	maxExpiresIn = 24 * time.Hour
)

// ConnectorConfig configures a Connector.
type ConnectorConfig struct {
	URL     string
	Secret  []byte        // signs every request (required)
	Timeout time.Duration // for one call; DefaultTimeout when zero
	Client  *http.Client
	// Clock returns the current time (default time.Now), which expires_in
	// counts from.
	Clock func() time.Time
}

// Connector asks the connect hook who a client is. Its methods may be
// called concurrently.
type Connector struct {
	url     string
	post    poster
	clock   func() time.Time
	metrics callMetrics
}

// NewConnector checks cfg and returns a Connector.
func NewConnector(cfg ConnectorConfig) (*Connector, error) {
	if len(cfg.Secret) == 0 {
		return nil, errors.New("hooks: a connect hook needs a secret to sign its requests")
	}
	if err := checkURL(cfg.URL); err != nil {
		return nil, fmt.Errorf("hooks: connect hook: %v", err)
	}
	clock := cfg.Clock
	if clock == nil {
		clock = time.Now
	}
	return &Connector{url: cfg.URL, post: newPoster(cfg.Secret, cfg.Timeout, cfg.Client), clock: clock,
		metrics: newCallMetrics("connect", "timeout, unreachable, bad reply")}, nil
}

// Collectors are the Connector's metrics, for a Prometheus registry.
func (c *Connector) Collectors() []prometheus.Collector { return c.metrics.collectors() }

// Authenticate asks the backend who sends a request with header, and
// returns the claims it grants: the same Claims a token gives, checked by
// the same rules. The error wraps ErrRefused (401 or 403) or
// ErrUnavailable (anything else but a 200 with a valid body).
func (c *Connector) Authenticate(ctx context.Context, req ConnectRequest, header http.Header) (*auth.Claims, error) {
	start := time.Now()
	claims, err := c.call(ctx, req, header)
	switch {
	case errors.Is(err, ErrRefused):
		c.metrics.observe(start, "refuse")
	case err != nil:
		c.metrics.observe(start, "error")
	default:
		c.metrics.observe(start, "allow")
	}
	return claims, err
}

func (c *Connector) call(ctx context.Context, req ConnectRequest, header http.Header) (*auth.Claims, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	fwd := make(http.Header, len(ForwardedHeaders))
	for _, name := range ForwardedHeaders {
		if vs := header.Values(name); len(vs) > 0 {
			fwd[http.CanonicalHeaderKey(name)] = vs
		}
	}
	status, reply, err := c.post.post(ctx, c.url, body, fwd)
	switch {
	case err != nil:
		return nil, err
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return nil, fmt.Errorf("%w (%d)", ErrRefused, status)
	case status != http.StatusOK:
		return nil, fmt.Errorf("%w: the connect hook answered %d", ErrUnavailable, status)
	}
	return c.claims(reply)
}

// claims checks a 200 reply as a token's claims are checked: a subject is
// required and the grants follow the grant rules.
func (c *Connector) claims(reply []byte) (*auth.Claims, error) {
	var r connectReply
	if err := json.Unmarshal(reply, &r); err != nil {
		return nil, fmt.Errorf(`%w: the connect hook's reply is not {"subject","grants","expires_in"}: %v`, ErrUnavailable, err)
	}
	if r.Subject == "" {
		return nil, fmt.Errorf("%w: the connect hook's reply has no subject", ErrUnavailable)
	}
	claim, err := json.Marshal(map[string]json.RawMessage{"grants": r.Grants})
	if len(r.Grants) == 0 {
		claim, err = []byte(`{"grants":[]}`), nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	grants, err := auth.ParseGrants(claim)
	if err != nil {
		return nil, fmt.Errorf("%w: the connect hook's grants: %v", ErrUnavailable, err)
	}
	ttl := defaultExpiresIn
	switch {
	case r.ExpiresIn >= maxExpiresIn.Seconds():
		ttl = maxExpiresIn
	case r.ExpiresIn > 0:
		ttl = time.Duration(r.ExpiresIn * float64(time.Second))
	}
	return &auth.Claims{Subject: r.Subject, Expiry: c.clock().Add(ttl), Grants: grants}, nil
}
