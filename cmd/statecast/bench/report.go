package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// result is what one scenario measured against one server. Times are
// in the unit their name says; zero fields did not apply (lost_* are
// always present).
type result struct {
	Scenario  string `json:"scenario"`
	Target    string `json:"target"`
	Command   string `json:"command,omitempty"`
	URL       string `json:"url"`
	ServerPID int    `json:"server_pid,omitempty"`
	ServerCmd string `json:"server_cmd,omitempty"`

	Subs    int     `json:"subs,omitempty"`
	Rooms   int     `json:"rooms,omitempty"`
	Conns   int     `json:"conns,omitempty"`
	Rate    float64 `json:"rate,omitempty"`
	Payload int     `json:"payload,omitempty"`
	Events  int     `json:"events,omitempty"`
	Repeats int     `json:"repeats,omitempty"`
	WindowS float64 `json:"window_s,omitempty"`

	ConnectS    float64 `json:"connect_s,omitempty"`
	DialRetries int64   `json:"dial_retries,omitempty"`

	// fanout, rooms
	WritesPerS  float64 `json:"writes_per_s,omitempty"`
	RedisCPUPct float64 `json:"redis_cpu_pct,omitempty"`
	// RedisCPUPctEach is each server's with several --redis-pid.
	RedisCPUPctEach []float64 `json:"redis_cpu_pct_each,omitempty"`
	RedisUsPerW     float64   `json:"redis_cpu_us_per_write,omitempty"`
	AckP50Ms        float64   `json:"ack_p50_ms,omitempty"`
	AckP99Ms        float64   `json:"ack_p99_ms,omitempty"`
	WritesSkipped   int64     `json:"writes_skipped,omitempty"`
	WriterStallS    float64   `json:"writer_stall_s,omitempty"` // waiting for replies, --window writes in flight
	OfferedPerS     float64   `json:"offered_per_s,omitempty"`
	Delivered       int64     `json:"delivered,omitempty"`
	DeliveredPerS   float64   `json:"delivered_per_s,omitempty"`
	LatencySamples  uint64    `json:"latency_samples,omitempty"`
	LatencyP50Ms    float64   `json:"latency_p50_ms,omitempty"`
	LatencyP99Ms    float64   `json:"latency_p99_ms,omitempty"`
	LatencyP999Ms   float64   `json:"latency_p999_ms,omitempty"`
	LatencyMaxMs    float64   `json:"latency_max_ms,omitempty"`
	LatencyMeanMs   float64   `json:"latency_mean_ms,omitempty"`
	DrainS          float64   `json:"drain_s,omitempty"`
	Coalesced       int64     `json:"coalesced,omitempty"`
	Snapshots       int64     `json:"snapshots,omitempty"`

	// LostSubs counts subscribers that lost something: statecast, whose
	// final view differs from the room or who did not reach its final
	// revision; the ceiling, who missed a message. LostMsgs counts the
	// revisions (offsets) neither delivered nor covered by a coalesced
	// message or snapshot.
	LostSubs     int64 `json:"lost_subs"`
	LostMsgs     int64 `json:"lost_msgs"`
	Disconnected int64 `json:"disconnected,omitempty"`

	ServerCPUUsPerMsg float64 `json:"server_cpu_us_per_msg,omitempty"`
	ServerCPUPct      float64 `json:"server_cpu_pct,omitempty"`
	ServerCPUS        float64 `json:"server_cpu_s,omitempty"`
	ServerRSSMB       float64 `json:"server_rss_mb,omitempty"`
	RSSBeforeMB       float64 `json:"server_rss_before_mb,omitempty"`
	RSSPerConnKB      float64 `json:"server_rss_per_conn_kb,omitempty"`
	// NodeCPUPctEach and NodeRSSMBEach are each --node-pid's.
	NodeCPUPctEach []float64 `json:"node_cpu_pct_each,omitempty"`
	NodeRSSMBEach  []float64 `json:"node_rss_mb_each,omitempty"`
	ToolCPUPct     float64   `json:"tool_cpu_pct,omitempty"`
	OtherCPUPct    float64   `json:"other_cpu_pct,omitempty"` // other processes of the machine

	// resume
	ResumeMs        []float64 `json:"resume_ms,omitempty"`
	ResumeMedianMs  float64   `json:"resume_median_ms,omitempty"`
	ResumeMinMs     float64   `json:"resume_min_ms,omitempty"`
	ResumeMaxMs     float64   `json:"resume_max_ms,omitempty"`
	ResumeFromSubMs float64   `json:"resume_from_sub_ms,omitempty"`
	ResumeComplete  int       `json:"resume_complete,omitempty"`
	ResumeSnapshots int       `json:"resume_snapshots,omitempty"`

	// storm
	StormAllS     float64 `json:"storm_all_synced_s,omitempty"`
	StormP50Ms    float64 `json:"storm_p50_ms,omitempty"`
	StormP99Ms    float64 `json:"storm_p99_ms,omitempty"`
	StormReplayed int64   `json:"storm_replayed,omitempty"`
	StormSnapshot int64   `json:"storm_snapshot,omitempty"`

	Attack *attackReport `json:"attack,omitempty"`

	Notes []string `json:"notes,omitempty"`
}

const maxNotes = 20

// addNote keeps the first notes and counts the others.
func (r *result) addNote(format string, a ...any) {
	switch {
	case len(r.Notes) < maxNotes:
		r.Notes = append(r.Notes, fmt.Sprintf(format, a...))
	case len(r.Notes) == maxNotes:
		r.Notes = append(r.Notes, "1 more")
	default:
		n, _ := strconv.Atoi(strings.TrimSuffix(r.Notes[maxNotes], " more"))
		r.Notes[maxNotes] = strconv.Itoa(n+1) + " more"
	}
}

func (r *result) setLatency(h *latencyHist) {
	ms := func(q float64) float64 { return float64(h.Quantile(q)) / 1e6 }
	r.LatencySamples = h.Count()
	r.LatencyP50Ms, r.LatencyP99Ms, r.LatencyP999Ms = ms(0.50), ms(0.99), ms(0.999)
	r.LatencyMaxMs = float64(h.Max()) / 1e6
	r.LatencyMeanMs = float64(h.Mean()) / 1e6
}

// figure is one line of the table: a figure and how to show it.
type figure struct {
	name string
	v    float64
	unit string
	// higher is better (for reading ratios); lower otherwise
	higher bool
	// shown even when zero
	always bool
}

// rows are the figures of r, in the order the table shows them.
func (r *result) rows() []figure {
	pid := r.ServerPID != 0
	var rows []figure
	add := func(ok bool, name string, v float64, unit string, higher, always bool) {
		if ok {
			rows = append(rows, figure{name, v, unit, higher, always})
		}
	}
	switch r.Scenario {
	case "fanout", "rooms":
		add(true, "subscribers", float64(r.Subs), "", true, true)
		add(r.Rooms > 0, "rooms", float64(r.Rooms), "", true, true)
		add(true, "connect + subscribe all", r.ConnectS, "s", false, true)
		add(true, "writes/s (offered "+fmtNum(r.Rate)+")", r.WritesPerS, "/s", true, true)
		add(true, "deliveries/s offered", r.OfferedPerS, "/s", true, true)
		add(true, "delivered msgs/s", r.DeliveredPerS, "/s", true, true)
		add(true, "latency p50", r.LatencyP50Ms, "ms", false, true)
		add(true, "latency p99", r.LatencyP99Ms, "ms", false, true)
		add(true, "latency p99.9", r.LatencyP999Ms, "ms", false, true)
		add(true, "latency max", r.LatencyMaxMs, "ms", false, true)
		add(true, "lost: subscribers", float64(r.LostSubs), "", false, true)
		add(true, "lost: messages", float64(r.LostMsgs), "", false, true)
		add(true, "coalesced msgs", float64(r.Coalesced), "", false, true)
		add(true, "snapshots (not initial)", float64(r.Snapshots), "", false, true)
		add(true, "disconnected", float64(r.Disconnected), "", false, true)
		add(pid, "server CPU per delivered msg", r.ServerCPUUsPerMsg, "µs", false, true)
		add(pid, "server CPU", r.ServerCPUPct, "%", false, true)
		add(pid, "server RSS", r.ServerRSSMB, "MB", false, true)
		for i, p := range r.NodeCPUPctEach {
			add(true, "… node "+strconv.Itoa(i+2)+" CPU", p, "%", false, true)
		}
		for i, m := range r.NodeRSSMBEach {
			add(true, "… node "+strconv.Itoa(i+2)+" RSS", m, "MB", false, true)
		}
		add(r.RedisCPUPct > 0, "redis CPU", r.RedisCPUPct, "%", false, true)
		for i, p := range r.RedisCPUPctEach {
			add(true, "… redis server "+strconv.Itoa(i+1), p, "%", false, true)
		}
		add(true, "load tool CPU", r.ToolCPUPct, "%", false, true)
		add(pid, "other processes CPU", r.OtherCPUPct, "%", false, true)
		add(true, "drain after writer stopped", r.DrainS, "s", false, true)
		add(true, "writes skipped (writer late)", float64(r.WritesSkipped), "", false, true)
		add(true, "writer waiting for the window", r.WriterStallS, "s", false, true)
		add(r.RedisUsPerW > 0, "redis CPU per write", r.RedisUsPerW, "µs", false, true)
	case "writes":
		add(true, "writes", float64(r.Events), "", true, true)
		add(true, "writer connections", float64(r.Subs), "", true, true)
		add(r.Rooms > 0, "rooms", float64(r.Rooms), "", true, true)
		add(true, "writes/s", r.WritesPerS, "/s", true, true)
		add(true, "write latency p50 (send to reply)", r.AckP50Ms, "ms", false, true)
		add(true, "write latency p99", r.AckP99Ms, "ms", false, true)
		add(pid, "server CPU per write", r.ServerCPUUsPerMsg, "µs", false, true)
		add(r.RedisUsPerW > 0, "redis CPU per write", r.RedisUsPerW, "µs", false, true)
		add(r.RedisCPUPct > 0, "redis CPU", r.RedisCPUPct, "%", false, true)
		for i, p := range r.RedisCPUPctEach {
			add(true, "… redis server "+strconv.Itoa(i+1), p, "%", false, true)
		}
		add(true, "load tool CPU", r.ToolCPUPct, "%", false, true)
		add(pid, "other processes CPU", r.OtherCPUPct, "%", false, true)
	case "idle":
		add(true, "connections", float64(r.Conns), "", true, true)
		add(true, "connect + subscribe all", r.ConnectS, "s", false, true)
		add(pid, "server RSS before", r.RSSBeforeMB, "MB", false, true)
		add(pid, "server RSS with connections", r.ServerRSSMB, "MB", false, true)
		add(pid, "server RSS per connection", r.RSSPerConnKB, "KB", false, true)
		add(pid, "server CPU while idle", r.ServerCPUPct, "%", false, true)
		add(pid, "other processes CPU", r.OtherCPUPct, "%", false, true)
		add(true, "disconnected", float64(r.Disconnected), "", false, true)
	case "resume":
		add(true, "missed writes", float64(r.Events), "", true, true)
		add(true, "runs", float64(r.Repeats), "", true, true)
		add(true, "back in sync (median)", r.ResumeMedianMs, "ms", false, true)
		add(true, "back in sync (min)", r.ResumeMinMs, "ms", false, true)
		add(true, "back in sync (max)", r.ResumeMaxMs, "ms", false, true)
		add(true, "from sub sent (median)", r.ResumeFromSubMs, "ms", false, true)
		add(true, "runs replaying all", float64(r.ResumeComplete), "", true, true)
		add(true, "runs with a snapshot", float64(r.ResumeSnapshots), "", false, true)
		add(true, "lost: messages", float64(r.LostMsgs), "", false, true)
		add(true, "writer: writes/s (burst)", r.WritesPerS, "/s", true, true)
		add(pid, "other processes CPU", r.OtherCPUPct, "%", false, true)
	case "storm":
		add(true, "connections", float64(r.Conns), "", true, true)
		add(true, "writes while away", float64(r.Events), "", true, true)
		add(true, "connect + subscribe all", r.ConnectS, "s", false, true)
		add(true, "all back in sync", r.StormAllS, "s", false, true)
		add(true, "back in sync p50", r.StormP50Ms, "ms", false, true)
		add(true, "back in sync p99", r.StormP99Ms, "ms", false, true)
		add(true, "resumed by replay", float64(r.StormReplayed), "", true, true)
		add(true, "resumed by snapshot", float64(r.StormSnapshot), "", false, true)
		add(true, "lost: subscribers", float64(r.LostSubs), "", false, true)
		add(true, "dial retries", float64(r.DialRetries), "", false, true)
		add(pid, "server CPU during resync", r.ServerCPUS, "s", false, true)
		add(pid, "other processes CPU", r.OtherCPUPct, "%", false, true)
	}
	return rows
}

// fmtNum prints v with about 4 significant digits, k and M for large
// ones.
func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case v == math.Trunc(v) && a < 100000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 999950: // would print as 1000.0k
		return strconv.FormatFloat(v/1e6, 'f', 3, 64) + "M"
	case a >= 1e5:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

func fmtValue(row figure) string {
	s := fmtNum(row.v)
	if row.unit != "" && row.unit != "/s" {
		s += " " + row.unit
	}
	return s
}

// printResult prints one result as a table.
func printResult(out io.Writer, r *result) {
	if r.Command != "" {
		fmt.Fprintf(out, "$ %s\n", r.Command)
	}
	fmt.Fprintf(out, "target: %s %s", r.Target, r.URL)
	if r.ServerPID != 0 {
		fmt.Fprintf(out, " (pid %d)", r.ServerPID)
	} else {
		fmt.Fprint(out, " (pid unknown: no server CPU or RSS; give --server-pid or --spawn)")
	}
	fmt.Fprintln(out)
	if r.ServerCmd != "" {
		fmt.Fprintf(out, "server: %s\n", r.ServerCmd)
	}
	fmt.Fprintln(out)
	t := [][]string{{r.Scenario, r.Target}}
	for _, row := range r.rows() {
		t = append(t, []string{row.name, fmtValue(row)})
	}
	printTable(out, t)
	printNotes(out, r)
}

func printNotes(out io.Writer, r *result) {
	for _, n := range r.Notes {
		fmt.Fprintf(out, "note (%s): %s\n", r.Target, n)
	}
}

// printTable prints rows with the first column left-aligned and the
// others right-aligned, a rule under the first row.
func printTable(out io.Writer, rows [][]string) {
	var w []int
	for _, r := range rows {
		for i, c := range r {
			if i >= len(w) {
				w = append(w, 0)
			}
			w[i] = max(w[i], utf8.RuneCountInString(c))
		}
	}
	for n, r := range rows {
		var b strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", w[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("   " + pad + c)
			}
		}
		fmt.Fprintln(out, strings.TrimRight(b.String(), " "))
		if n == 0 {
			total := 0
			for i, x := range w {
				total += x
				if i > 0 {
					total += 3
				}
			}
			fmt.Fprintln(out, strings.Repeat("-", total))
		}
	}
}
