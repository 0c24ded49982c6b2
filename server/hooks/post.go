package hooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
)

// ErrUnavailable: the backend did not answer in time, could not be
// reached, or answered something else than a 2xx with the JSON asked for.
// Nothing is decided: a write is not committed, a connection not let in.
var ErrUnavailable = errors.New("hooks: the backend is unavailable")

// DefaultTimeout bounds one call to a backend when none is configured.
const DefaultTimeout = 2 * time.Second

// maxReply bounds the reply body read from a backend.
const maxReply = 64 << 10

// poster sends signed JSON requests to backends.
type poster struct {
	secret  []byte
	timeout time.Duration
	client  *http.Client
	// ignoreReply: only the status counts (webhooks); the reply is
	// drained up to maxReply and not returned, whatever its size.
	ignoreReply bool
}

func newPoster(secret []byte, timeout time.Duration, client *http.Client) poster {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// Every write to a hooked room is a call: keep connections for
		// concurrent writers instead of net/http's default of 2.
		t.MaxIdleConnsPerHost = 64
		client = &http.Client{Transport: t}
	}
	// A redirect is an answer other than the one asked for: unavailable.
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return poster{secret: secret, timeout: timeout, client: &c}
}

// post sends body to url, signed, with the extra header fields, and
// returns the reply's status and body (at most maxReply bytes). Any
// failure to get a reply in time wraps ErrUnavailable.
func (p poster) post(ctx context.Context, url string, body []byte, header http.Header) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "statecast-hooks")
	req.Header.Set(SignatureHeader, Sign(p.secret, body, time.Now()))
	// The caller's trace goes on with the backend (nothing without a span).
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := p.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return 0, nil, fmt.Errorf("%w: no answer within %v", ErrUnavailable, p.timeout)
		}
		return 0, nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if p.ignoreReply {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxReply))
		return resp.StatusCode, nil, nil
	}
	reply, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	switch {
	case err != nil:
		return 0, nil, fmt.Errorf("%w: reading the reply: %v", ErrUnavailable, err)
	case len(reply) > maxReply:
		return 0, nil, fmt.Errorf("%w: reply larger than %d bytes", ErrUnavailable, maxReply)
	}
	return resp.StatusCode, reply, nil
}

// callMetrics count one hook's calls by outcome (allow, refuse, error)
// and time them.
type callMetrics struct {
	calls   *prometheus.CounterVec
	latency prometheus.Histogram
}

// newCallMetrics names them statecast_hook_<hook>_total and _seconds.
func newCallMetrics(hook, errorCauses string) callMetrics {
	return callMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statecast_hook_" + hook + "_total",
			Help: "Calls of the " + hook + " hook, by outcome: allow, refuse, or error (" + errorCauses + ")."}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "statecast_hook_" + hook + "_seconds",
			Help: "Time of one call of the " + hook + " hook.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
	}
}

func (m callMetrics) observe(start time.Time, outcome string) {
	m.latency.Observe(time.Since(start).Seconds())
	m.calls.WithLabelValues(outcome).Inc()
}

func (m callMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.calls, m.latency}
}
