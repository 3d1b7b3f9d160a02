package grafana_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/internal/promql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// metricsDoc lists every metric sm-manager exposes, with its type and labels;
// manager/metrics_doc_test.go keeps it true to the code.
const metricsDoc = "../../docs/metrics.md"

// metric is one row of docs/metrics.md's metric tables.
type metric struct {
	typ    string
	labels []string
}

var backquoted = regexp.MustCompile("`([^`]+)`")

// readMetrics returns docs/metrics.md's metric rows by name:
// | `name` | type | `label`, … | what it says |.
func readMetrics(t *testing.T) map[string]metric {
	t.Helper()
	b, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]metric{}
	for line := range strings.Lines(string(b)) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) < 4 || cells[0] != "" {
			continue
		}
		name := backquoted.FindStringSubmatch(strings.TrimSpace(cells[1]))
		typ := strings.TrimSpace(cells[2])
		if name == nil || !slices.Contains([]string{"counter", "gauge", "histogram", "summary"}, typ) {
			continue
		}
		m := metric{typ: typ}
		if len(cells) > 5 { // the manager's tables have a labels column; the Go runtime's does not
			for _, l := range backquoted.FindAllStringSubmatch(cells[3], -1) {
				m.labels = append(m.labels, l[1])
			}
		}
		out[name[1]] = m
	}
	return out
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"job", "instance"}

// checkSelector reports what is wrong with sel against the exposed metrics:
// a name nothing exposes (a histogram's own name is no series either: only
// its _bucket, _sum and _count are), or a label the metric does not carry.
func checkSelector(known map[string]metric, sel promql.Selector) error {
	m, ok := known[sel.Name]
	labels := append(slices.Clone(targetLabels), m.labels...)
	if ok && (m.typ == "histogram" || m.typ == "summary") {
		return fmt.Errorf("%s is a %s: select its _bucket, _sum or _count", sel.Name, m.typ)
	}
	if !ok {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base, cut := strings.CutSuffix(sel.Name, suffix)
			if h, hok := known[base]; cut && hok && (h.typ == "histogram" || h.typ == "summary" && suffix != "_bucket") {
				m, ok = h, true
				labels = append(labels, h.labels...)
				if suffix == "_bucket" {
					labels = append(labels, "le")
				}
				if h.typ == "summary" {
					labels = append(labels, "quantile")
				}
			}
		}
	}
	if !ok {
		return fmt.Errorf("no metric %s in %s", sel.Name, metricsDoc)
	}
	if !strings.HasPrefix(sel.Name, "sm_") {
		return nil // the Go and process collectors' labels are theirs
	}
	for _, l := range sel.Labels {
		if !slices.Contains(labels, l) {
			return fmt.Errorf("%s has no label %s (it has %v)", sel.Name, l, labels)
		}
	}
	return nil
}

// query is one PromQL expression of a dashboard and where it is.
type query struct{ where, expr string }

// labelValues is Grafana's variable query label_values(selector, label).
var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)

// queries returns every PromQL expression of dashboard: each target's and
// annotation's "expr", and each query variable's label_values selector.
func queries(t *testing.T, dashboard []byte) []query {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(dashboard, &doc); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var out []query
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where += " / " + title
			}
			for k, x := range v {
				switch s, isStr := x.(string); {
				case isStr && k == "expr":
					out = append(out, query{where, s})
				case isStr && k == "definition":
					m := labelValues.FindStringSubmatch(s)
					if m == nil {
						t.Errorf("%s: variable query %q is not label_values(selector, label)", where, s)
						continue
					}
					out = append(out, query{where + " (variable)", m[1]})
				default:
					walk(where, x)
				}
			}
		case []any:
			for _, x := range v {
				walk(where, x)
			}
		}
	}
	walk("dashboard", doc)
	return out
}

// checkDashboard returns every fault of dashboard's queries.
func checkDashboard(t *testing.T, known map[string]metric, dashboard []byte) (errs []string, names []string) {
	qs := queries(t, dashboard)
	if len(qs) == 0 {
		errs = append(errs, "no queries found")
	}
	for _, q := range qs {
		sels, err := promql.Selectors(q.expr)
		if err == nil && len(sels) == 0 {
			err = fmt.Errorf("selects no metric")
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %q: %v", q.where, q.expr, err))
			continue
		}
		for _, sel := range sels {
			names = append(names, sel.Name)
			if err := checkSelector(known, sel); err != nil {
				errs = append(errs, fmt.Sprintf("%s: %q: %v", q.where, q.expr, err))
			}
		}
	}
	slices.Sort(names)
	return errs, slices.Compact(names)
}

// Every query of deploy/grafana/sm.json selects metrics sm-manager exposes,
// with labels they carry, and the dashboard covers what an operator watches.
func TestDashboardQueries(t *testing.T) {
	known := readMetrics(t)
	if len(known) < 20 || known["sm_request_duration_seconds"].typ != "histogram" {
		t.Fatalf("read %d metrics from %s: the table parse is broken", len(known), metricsDoc)
	}
	b, err := os.ReadFile("sm.json")
	if err != nil {
		t.Fatal(err)
	}
	errs, names := checkDashboard(t, known, b)
	for _, e := range errs {
		t.Error(e)
	}
	t.Logf("%d metrics queried: %v", len(names), names)
	// Clusters up, restarts, routed requests and their latency, the identify
	// gate, deploys.
	for _, want := range []string{"sm_clusters", "sm_cluster_restarts_total", "sm_requests_forwarded_total",
		"sm_request_duration_seconds_bucket", "sm_identify_granted_total", "sm_identify_waiting",
		"sm_deploys_total", "sm_deploy_running"} {
		if !slices.Contains(names, want) {
			t.Errorf("the dashboard does not query %s", want)
		}
	}
	type rect struct{ X, Y, W, H int }
	var doc struct {
		UID    string
		Panels []struct {
			ID          int
			Type, Title string
			Targets     []json.RawMessage
			GridPos     rect
		}
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.UID == "" {
		t.Error("the dashboard has no uid: each import would make a new copy")
	}
	ids := map[int]bool{}
	for i, p := range doc.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if ids[p.ID] {
			t.Errorf("panel %q reuses id %d", p.Title, p.ID)
		}
		ids[p.ID] = true
		// Grafana's grid is 24 wide; panels that overlap are drawn over each other.
		g := p.GridPos
		if g.W < 1 || g.H < 1 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q is off the grid: %+v", p.Title, g)
		}
		for _, q := range doc.Panels[:i] {
			o := q.GridPos
			if g.X < o.X+o.W && o.X < g.X+g.W && g.Y < o.Y+o.H && o.Y < g.Y+g.H {
				t.Errorf("panels %q %+v and %q %+v overlap", q.Title, o, p.Title, g)
			}
		}
	}
}

// The check fails a dashboard with bad queries: the deliberately bad ones.
func TestDashboardCheckCatchesBadQueries(t *testing.T) {
	known := readMetrics(t)
	bad := `{"panels":[{"title":"bad","targets":[
		{"expr":"sum(rate(sm_requests_forwarded_totl[5m]))"},
		{"expr":"histogram_quantile(0.5, rate(sm_request_duration_seconds[5m]))"},
		{"expr":"sum(sm_clusters{status=\"ready\"})"},
		{"expr":"sum(rate(sm_requests_forwarded_total[5m])"},
		{"expr":"vector(1)"},
		{"expr":"rate(sm_request_duration_seconds_bucket{le=\"0.1\"}[5m]) + sm_cluster_restarts_total{le=\"1\"}"},
		{"expr":"sum(rate(sm_requests_forwarded_total{job=~\"$job\"}[$__rate_interval]))"}
	]}],"templating":{"list":[{"definition":"label_values(sm_nope, job)"}]}}`
	errs, _ := checkDashboard(t, known, []byte(bad))
	wants := []string{
		"no metric sm_requests_forwarded_totl",
		"sm_request_duration_seconds is a histogram",
		"sm_clusters has no label status",
		"unclosed (",
		"selects no metric",
		"sm_cluster_restarts_total has no label le",
		"(variable)",
	}
	if len(errs) != len(wants) {
		t.Errorf("%d faults, want %d (the last query is good): %q", len(errs), len(wants), errs)
	}
	for _, w := range wants {
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, w) }) {
			t.Errorf("no fault says %q: %q", w, errs)
		}
	}
}

// alertExprs returns the expr of every rule in docs/metrics.md's example
// alert rules (the yaml block after "## Example alert rules"), one-line or
// block (`expr: |`).
func alertExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "## Example alert rules")
	_, rest, ok2 := strings.Cut(rest, "```yaml\n")
	block, _, ok3 := strings.Cut(rest, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatalf("%s: no yaml block of example alert rules", metricsDoc)
	}
	var out []string
	lines := strings.Split(block, "\n")
	for i := 0; i < len(lines); i++ {
		key, val, found := strings.Cut(strings.TrimSpace(lines[i]), "expr:")
		if !found || key != "" {
			continue
		}
		val = strings.TrimSpace(val)
		if val == "|" || val == ">" {
			indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
			var body []string
			for i+1 < len(lines) {
				next := lines[i+1]
				if strings.TrimSpace(next) != "" && len(next)-len(strings.TrimLeft(next, " ")) <= indent {
					break
				}
				body = append(body, next)
				i++
			}
			val = strings.Join(body, "\n")
		}
		out = append(out, val)
	}
	return out
}

// The example alert rules of docs/metrics.md pass the same check; `up` is
// Prometheus's own series for every target.
func TestAlertRuleQueries(t *testing.T) {
	known := readMetrics(t)
	known["up"] = metric{typ: "gauge"}
	exprs := alertExprs(t)
	if len(exprs) < 10 {
		t.Fatalf("found %d alert exprs in %s: the yaml parse is broken", len(exprs), metricsDoc)
	}
	for _, e := range exprs {
		sels, err := promql.Selectors(e)
		if err == nil && len(sels) == 0 {
			err = fmt.Errorf("selects no metric")
		}
		if err != nil {
			t.Errorf("alert %q: %v", e, err)
			continue
		}
		for _, sel := range sels {
			if err := checkSelector(known, sel); err != nil {
				t.Errorf("alert %q: %v", e, err)
			}
		}
	}
}
