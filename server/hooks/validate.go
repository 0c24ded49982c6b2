package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// ValidateRequest is what a node POSTs to the validation hook of a room
// before a write to it commits (docs/HOOKS.md).
type ValidateRequest struct {
	// Subject is the writer's: its token's "sub", or the connect hook's
	// subject; "" for an anonymous client.
	Subject string `json:"subject"`
	// Session is the writing WebSocket session's id ("" over HTTP): the
	// server gave it to the connection, so it names an anonymous writer.
	Session string `json:"session,omitempty"`
	Room    string `json:"room"`
	Ops     []Op   `json:"ops"`
	Conds   []Cond `json:"conds"`
	// ModRevs is the current mod_rev of every key the write touches or
	// is conditional on, 0 for a key that does not exist. The write
	// commits only if they are still those.
	ModRevs map[string]uint64 `json:"mod_revs"`
	// Wid is the write's id, when the client gave one.
	Wid string `json:"wid,omitempty"`
}

// Op is one operation of a write: "put" (with its JSON value and its
// lease, if any) or "delete".
type Op struct {
	Type  string          `json:"type"`
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value,omitempty"`
	Lease string          `json:"lease,omitempty"`
}

// Cond is one of the client's own conditions: key must have mod_rev.
type Cond struct {
	Key    string `json:"key"`
	ModRev uint64 `json:"mod_rev"`
}

// Verdict is the validation hook's answer: {"allow":true}, or
// {"allow":false,"message":"…"}, the message shown to the writer.
type Verdict struct {
	Allow   bool   `json:"allow"`
	Message string `json:"message,omitempty"`
}

// maxMessage bounds a refusal's message passed on to the client.
const maxMessage = 512

// ValidatorConfig configures a Validator.
type ValidatorConfig struct {
	Routes  Routes        // which rooms go to which URL
	Secret  []byte        // signs every request (required)
	Timeout time.Duration // for one call; DefaultTimeout when zero
	Client  *http.Client  // default: one with its own transport
}

// Validator asks the backends of its routes about writes. Its methods
// may be called concurrently.
type Validator struct {
	routes  Routes
	post    poster
	metrics callMetrics
}

// NewValidator checks cfg and returns a Validator.
func NewValidator(cfg ValidatorConfig) (*Validator, error) {
	if len(cfg.Secret) == 0 {
		return nil, errors.New("hooks: a validation hook needs a secret to sign its requests")
	}
	return &Validator{
		routes:  cfg.Routes,
		post:    newPoster(cfg.Secret, cfg.Timeout, cfg.Client),
		metrics: newCallMetrics("validate", "timeout, unreachable, bad reply: the write failed unavailable"),
	}, nil
}

// Collectors are the Validator's metrics, for a Prometheus registry.
func (v *Validator) Collectors() []prometheus.Collector { return v.metrics.collectors() }

// Matches reports whether writes to room are validated.
func (v *Validator) Matches(room string) bool {
	if v == nil {
		return false
	}
	_, ok := v.routes.Match(room)
	return ok
}

// Validate asks the backend of req.Room's route about the write. A
// backend that answers in time with a 2xx and {"allow":bool} decides;
// anything else is an error wrapping ErrUnavailable. A room no route
// matches is allowed.
func (v *Validator) Validate(ctx context.Context, req *ValidateRequest) (Verdict, error) {
	route, ok := v.routes.Match(req.Room)
	if !ok {
		return Verdict{Allow: true}, nil
	}
	start := time.Now()
	verdict, err := v.call(ctx, route.URL, req)
	switch {
	case err != nil:
		v.metrics.observe(start, "error")
	case verdict.Allow:
		v.metrics.observe(start, "allow")
	default:
		v.metrics.observe(start, "refuse")
	}
	return verdict, err
}

func (v *Validator) call(ctx context.Context, url string, req *ValidateRequest) (Verdict, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Verdict{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	status, reply, err := v.post.post(ctx, url, body, nil)
	if err != nil {
		return Verdict{}, err
	}
	if status < 200 || status > 299 {
		return Verdict{}, fmt.Errorf("%w: the backend answered %d", ErrUnavailable, status)
	}
	var verdict struct {
		Allow   *bool  `json:"allow"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(reply, &verdict); err != nil || verdict.Allow == nil {
		return Verdict{}, fmt.Errorf(`%w: the backend's reply is not {"allow":true|false,"message":"…"}`, ErrUnavailable)
	}
	return Verdict{Allow: *verdict.Allow, Message: truncate(verdict.Message, maxMessage)}, nil
}

// truncate cuts s to at most n bytes, at a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
