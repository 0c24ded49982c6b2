package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/servertest"
)

// dashboardPath is the Grafana dashboard docs/OPERATIONS.md links.
const dashboardPath = "../../docs/grafana/statecast.json"

// TestDashboardMetricsExist: every metric the Grafana dashboard's queries
// name is exported at /metrics by `statecast serve` (a histogram by its
// _bucket, _sum or _count series), on a node with a validation hook and a
// webhook that has taken a write, a subscription and a delivery.
func TestDashboardMetricsExist(t *testing.T) {
	used := dashboardMetrics(t)
	if len(used) < 10 {
		t.Fatalf("the dashboard names %d metrics: %v; its queries were not read", len(used), used)
	}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer receiver.Close()
	n := &mnNode{name: "dashboard", redisURL: "memory",
		extra: []string{"--webhook", "doc:*=" + receiver.URL, "--webhook-secret", "dashboard-test"}} // --demo-hooks validates lobby:demo* rooms
	n.start(t)
	defer n.signal(syscall.SIGTERM, 10*time.Second)

	ctx := servertest.Context(t)
	c, err := client.Dial(ctx, n.WS(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Subscribe(ctx, "doc:1", client.SubscribeOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, room := range []string{"doc:1", "lobby:demo1"} {
		if _, err := c.Put(ctx, room, "k", 1); err != nil {
			t.Fatalf("put in %s: %v", room, err)
		}
	}
	var have map[string]bool
	deadline := time.Now().Add(20 * time.Second)
	for {
		have = scrape(t, n.HTTP()+"/metrics")
		missing := 0
		for _, name := range used {
			if !have[name] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the webhook's delivery is asynchronous
	}
	for _, name := range used {
		if !have[name] {
			t.Errorf("the dashboard queries %s, which /metrics does not export", name)
		}
	}
}

// promKeywords are the words of PromQL that are not metric names.
var promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true}

var (
	promSkip  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]|\b(by|without|on|ignoring)\s*\([^)]*\)|"[^"]*"`)
	promIdent = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
)

// dashboardMetrics returns the metric names of the dashboard's PromQL:
// its panels' targets and its variables' queries.
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct{ Query string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		// label_values(METRIC, LABEL): the label is not a metric.
		q := regexp.MustCompile(`,\s*\w+\s*\)`).ReplaceAllString(v.Query, ")")
		exprs = append(exprs, q)
	}
	seen := map[string]bool{}
	var names []string
	for _, e := range exprs {
		for _, m := range promIdent.FindAllString(promSkip.ReplaceAllString(e, " "), -1) {
			if strings.HasSuffix(m, "(") || promKeywords[strings.ToLower(m)] { // a function, or a keyword
				continue
			}
			if m = strings.TrimSpace(m); !seen[m] {
				seen[m] = true
				names = append(names, m)
			}
		}
	}
	return names
}

// scrape returns the names of the series url exports.
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		names[name] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}
