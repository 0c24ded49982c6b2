package hooks

import (
	"cmp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// InspectHook is a hook as the inspector (/v1/admin/inspect) shows it.
type InspectHook struct {
	ID      string `json:"id"`
	Pattern string `json:"pattern"`
	URL     string `json:"url"`
	// Claimed: this node delivers the hook; Holder names the node that
	// does, as last seen.
	Claimed bool   `json:"claimed"`
	Holder  string `json:"holder,omitempty"`
	Error   string `json:"error,omitempty"`
	// Rooms followed by this node (the holder), the most behind first, at
	// most inspectRooms of them.
	Rooms      []InspectHookRoom `json:"rooms"`
	RoomsTotal int               `json:"rooms_total"`
	LagRevs    uint64            `json:"lag_revisions"`
	Delivered  uint64            `json:"delivered_revisions"`
	Failures   uint64            `json:"failures"`
}

// InspectHookRoom is one room of a hook.
type InspectHookRoom struct {
	Room       string  `json:"room"`
	Epoch      string  `json:"epoch"`
	Cursor     uint64  `json:"cursor"` // last revision acknowledged
	Head       uint64  `json:"head"`
	Lag        uint64  `json:"lag"` // revisions not yet acknowledged
	LagSeconds float64 `json:"lag_seconds"`
	Attempts   int     `json:"attempts"` // failed attempts of the pending delivery
	LastError  string  `json:"last_error,omitempty"`
}

// inspectRooms bounds the rooms per hook shown by the inspector, and
// topRooms those with a lag gauge of their own in /metrics.
const (
	inspectRooms = 100
	topRooms     = 10
)

// rooms returns the rooms of the hook's run, the most behind first.
func (h *hook) rooms(now time.Time) []InspectHookRoom {
	h.mu.Lock()
	r := h.run
	h.mu.Unlock()
	if r == nil {
		return nil
	}
	r.mu.Lock()
	out := make([]InspectHookRoom, 0, len(r.rooms))
	for _, rs := range r.rooms {
		ir := InspectHookRoom{Room: rs.name, Epoch: rs.cur.Epoch, Cursor: rs.cur.Rev, Head: rs.head,
			Attempts: rs.attempts, LastError: rs.lastErr}
		if rs.head > rs.cur.Rev {
			ir.Lag = rs.head - rs.cur.Rev
			if !rs.pendingSince.IsZero() {
				ir.LagSeconds = max(0, now.Sub(rs.pendingSince).Seconds())
			}
		}
		out = append(out, ir)
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b InspectHookRoom) int {
		return cmp.Or(cmp.Compare(b.Lag, a.Lag), cmp.Compare(b.Attempts, a.Attempts), cmp.Compare(a.Room, b.Room))
	})
	return out
}

// Inspect describes every hook of the node.
func (w *Webhooks) Inspect() []InspectHook {
	now := time.Now()
	out := make([]InspectHook, 0, len(w.hooks))
	for _, h := range w.hooks {
		rooms := h.rooms(now)
		if rooms == nil {
			rooms = []InspectHookRoom{}
		}
		ih := InspectHook{ID: h.id, Pattern: h.spec.Pattern, URL: redact(h.spec.URL), RoomsTotal: len(rooms),
			Delivered: h.stats.revisions.Load(), Failures: h.stats.failures.Load()}
		for _, r := range rooms {
			ih.LagRevs += r.Lag
		}
		h.mu.Lock()
		ih.Claimed, ih.Holder, ih.Error = h.run != nil, h.claim.holder, h.lastErr
		h.mu.Unlock()
		ih.Rooms = rooms[:min(len(rooms), inspectRooms)]
		out = append(out, ih)
	}
	return out
}

var (
	descRevisions  = prometheus.NewDesc("statecast_webhook_revisions_total", "Revisions delivered and acknowledged, by hook.", []string{"hook"}, nil)
	descDeliveries = prometheus.NewDesc("statecast_webhook_deliveries_total", "POSTs acknowledged with a 2xx, by hook.", []string{"hook"}, nil)
	descFailures   = prometheus.NewDesc("statecast_webhook_failures_total", "POSTs that failed (error, timeout or non-2xx answer), by hook.", []string{"hook"}, nil)
	descRetries    = prometheus.NewDesc("statecast_webhook_retries_total", "Delivery steps retried after a backoff (failed POSTs and failed cursor writes), by hook.", []string{"hook"}, nil)
	descSnapshots  = prometheus.NewDesc("statecast_webhook_snapshots_total", "Snapshots delivered, by hook and reason.", []string{"hook", "reason"}, nil)
	descClaimed    = prometheus.NewDesc("statecast_webhook_claimed", "1 when this node delivers the hook.", []string{"hook"}, nil)
	descRooms      = prometheus.NewDesc("statecast_webhook_rooms", "Rooms this node delivers for the hook, by state (behind: revisions not acknowledged; failing: its last attempt failed).", []string{"hook", "state"}, nil)
	descLagRevs    = prometheus.NewDesc("statecast_webhook_lag_revisions", "Revisions committed and not yet acknowledged, over the hook's rooms on this node.", []string{"hook"}, nil)
	descLagSeconds = prometheus.NewDesc("statecast_webhook_lag_seconds", "Age of the oldest revision not yet acknowledged (at most), over the hook's rooms.", []string{"hook"}, nil)
	descRoomLag    = prometheus.NewDesc("statecast_webhook_room_lag_revisions", "Revisions not yet acknowledged, for the 10 rooms of the hook most behind (bounded cardinality: the inspector lists more).", []string{"hook", "room"}, nil)
)

// Describe implements prometheus.Collector.
func (w *Webhooks) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRevisions, descDeliveries, descFailures, descRetries, descSnapshots,
		descClaimed, descRooms, descLagRevs, descLagSeconds, descRoomLag} {
		ch <- d
	}
	for _, h := range w.hooks {
		h.stats.lag.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (w *Webhooks) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, h := range w.hooks {
		st := &h.stats
		counter(descRevisions, st.revisions.Load(), h.id)
		counter(descDeliveries, st.deliveries.Load(), h.id)
		counter(descFailures, st.failures.Load(), h.id)
		counter(descRetries, st.retries.Load(), h.id)
		for i, r := range reasons {
			counter(descSnapshots, st.snapshots[i].Load(), h.id, r)
		}
		st.lag.Collect(ch)
		rooms := h.rooms(now)
		h.mu.Lock()
		claimed := h.run != nil
		h.mu.Unlock()
		gauge(descClaimed, b2f(claimed), h.id)
		var lag uint64
		var lagSec float64
		behind, failing := 0, 0
		for i, r := range rooms {
			lag += r.Lag
			lagSec = max(lagSec, r.LagSeconds)
			if r.Lag > 0 {
				behind++
			}
			if r.Attempts > 0 {
				failing++
			}
			if i < topRooms && r.Lag > 0 {
				gauge(descRoomLag, float64(r.Lag), h.id, r.Room)
			}
		}
		gauge(descRooms, float64(behind), h.id, "behind")
		gauge(descRooms, float64(failing), h.id, "failing")
		gauge(descLagRevs, float64(lag), h.id)
		gauge(descLagSeconds, lagSec, h.id)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
