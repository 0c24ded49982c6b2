package server

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/rooms/filter"
	"github.com/statecast/statecast/store"
)

// metrics are the Prometheus collectors of one Server, registered on the
// Registerer of its Config (no globals: two servers in one process, as in
// tests, do not share counters).
type metrics struct {
	connections   prometheus.Gauge
	subscriptions prometheus.Gauge
	rejected      *prometheus.CounterVec // connections refused, by reason
	socketsVec    *prometheus.GaugeVec
	sockets       [3]prometheus.Gauge    // open TCP connections, per connKind
	writes        *prometheus.CounterVec // by outcome
	writesOK      prometheus.Counter     // writes, resolved for "ok" once
	writeLatency  prometheus.Histogram
	delivered     *prometheus.CounterVec // subscription messages, by kind
	deliveredBy   [8]prometheus.Counter  // delivered, resolved per rooms.Kind
	snapshots     *prometheus.CounterVec // by reason: initial, compacted, epoch, slow
	starts        *prometheus.CounterVec // subscriptions started: fresh or resume
	bytesOut      prometheus.Counter
	framesOut     prometheus.Counter
	slowCloses    prometheus.Counter
	writers       prometheus.Counter
	rateLimited   prometheus.Counter
	authFailures  prometheus.Counter
	leasesEnded   prometheus.Counter
	storeErrors   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, eng *rooms.Engine) (*metrics, error) {
	m := &metrics{
		connections:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "statecast_connections", Help: "Open WebSocket connections."}),
		subscriptions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "statecast_subscriptions", Help: "Active subscriptions (WebSocket and SSE)."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statecast_connections_rejected_total",
			Help: "Connections refused, by reason: full (503, or close 4004 for a WebSocket the node filled up during: past --max-connections), connecting (503: past --max-connecting), reserve_full and per_ip (closed at accept), upgrade (bad WebSocket handshake)."}, []string{"reason"}),
		socketsVec: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "statecast_sockets",
			Help: "Open TCP connections, by what they carry: http (requests and keep-alive), sse or ws."}, []string{"kind"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statecast_writes_total", Help: "Writes (events in), by outcome."}, []string{"outcome"}),
		writeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "statecast_write_seconds", Help: "Time to commit a write to the store.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		delivered:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statecast_messages_out_total", Help: "Subscription messages sent (events out), by kind."}, []string{"kind"}),
		snapshots:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statecast_snapshots_total", Help: "Snapshots sent, by reason (compacted and epoch are resume fallbacks)."}, []string{"reason"}),
		starts:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statecast_subscribe_total", Help: "Subscriptions started, fresh or resuming."}, []string{"mode"}),
		bytesOut:   prometheus.NewCounter(prometheus.CounterOpts{Name: "statecast_bytes_out_total", Help: "Bytes written to WebSockets."}),
		framesOut:  prometheus.NewCounter(prometheus.CounterOpts{Name: "statecast_frames_out_total", Help: "WebSocket frames written (each may batch many messages)."}),
		slowCloses: prometheus.NewCounter(prometheus.CounterOpts{Name: "statecast_slow_consumer_closes_total", Help: "Sockets closed for not draining within the write timeout."}),
		writers: prometheus.NewCounter(prometheus.CounterOpts{Name: "statecast_ws_writers_started_total",
			Help: "Goroutines given to one socket's writes: for a subscription's first messages, or a socket that did not take a frame at once (the node's few flushers send the rest)."}),
		rateLimited:  prometheus.NewCounter(prometheus.CounterOpts{Name: "statecast_rate_limited_total", Help: "Writes refused by the per-subject write rate limit."}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "statecast_auth_failures_total", Help: "Tokens refused."}),
		leasesEnded:  prometheus.NewCounter(prometheus.CounterOpts{Name: "statecast_leases_ended_total", Help: "Leases ended (expired, released or revoked)."}),
		storeErrors:  prometheus.NewCounter(prometheus.CounterOpts{Name: "statecast_store_errors_total", Help: "Store operations that failed for a reason other than bad input or a conflict."}),
	}
	for k := range m.sockets {
		m.sockets[k] = m.socketsVec.WithLabelValues(connKind(k).String())
	}
	for k := rooms.KindEvents; k <= rooms.KindCoalesced; k++ {
		m.deliveredBy[k] = m.delivered.WithLabelValues(k.String())
	}
	m.writesOK = m.writes.WithLabelValues("ok")
	for _, c := range []prometheus.Collector{m.connections, m.subscriptions, m.rejected, m.socketsVec, m.writes, m.writeLatency,
		m.delivered, m.snapshots, m.starts, m.bytesOut, m.framesOut, m.slowCloses, m.writers, m.rateLimited, m.authFailures,
		m.leasesEnded, m.storeErrors,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "statecast_room_loads_total",
			Help: "Rooms loaded from the store, each a snapshot read (once per room however many watch it; again after an unload or a reset)."},
			func() float64 { return float64(eng.Loads()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "statecast_filter_evals_total",
			Help: "Evaluations of watch filters: one per event per distinct filter of the room's matching watchers, and one per key of a filtered snapshot or list."},
			func() float64 { return float64(filter.Evals.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "statecast_filter_eval_errors_total",
			Help: "Evaluations of watch filters that failed (a missing field, a type mismatch, the cost limit): the key counted as not matching."},
			func() float64 { return float64(filter.EvalErrors.Load()) })} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observeWrite records one write's latency and outcome.
func (m *metrics) observeWrite(start time.Time, err error) {
	m.writeLatency.Observe(time.Since(start).Seconds())
	var pe *Error
	switch {
	case err == nil:
		m.writesOK.Inc()
	case errors.Is(err, store.ErrConflict):
		m.writes.WithLabelValues("conflict").Inc()
	case errors.As(err, &pe), isInputError(err):
		m.writes.WithLabelValues("rejected").Inc()
	default:
		m.writes.WithLabelValues("error").Inc()
		m.storeErrors.Inc()
	}
}

func isInputError(err error) bool {
	for _, e := range []error{store.ErrInvalidRoom, store.ErrInvalidKey, store.ErrValueTooLarge, store.ErrTooManyOps,
		store.ErrDuplicateKey, store.ErrCrossRoom, store.ErrEmptyWrite, store.ErrInvalidOp} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// countStart counts a subscription start.
func (m *metrics) countStart(from *rooms.Position) {
	if from == nil {
		m.starts.WithLabelValues("fresh").Inc()
	} else {
		m.starts.WithLabelValues("resume").Inc()
	}
}

// countDelivered counts the messages of one drain, with one counter
// update per kind present: this runs once per socket per fan-out.
func (m *metrics) countDelivered(msgs []rooms.Message) {
	var n [len(m.deliveredBy)]int
	for _, msg := range msgs {
		n[msg.Kind]++
		if msg.Kind == rooms.KindSnapshot {
			m.snapshots.WithLabelValues(msg.Reason.String()).Inc()
		}
	}
	for k, c := range n {
		if c > 0 {
			m.deliveredBy[k].Add(float64(c))
		}
	}
}
