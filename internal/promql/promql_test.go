package promql_test

import (
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/internal/promql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSelectors(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []promql.Selector // nil: none
	}{
		{`up`, []promql.Selector{{Name: "up"}}},
		{`sm_clusters{state="ready"}`, []promql.Selector{{Name: "sm_clusters", Labels: []string{"state"}}}},
		{`sum(sm_clusters{state="ready", job=~"$job"})`,
			[]promql.Selector{{Name: "sm_clusters", Labels: []string{"state", "job"}}}},
		{`sum by (job, instance) (rate(sm_requests_forwarded_total{job=~"$job"}[$__rate_interval]))`,
			[]promql.Selector{{Name: "sm_requests_forwarded_total", Labels: []string{"job"}}}},
		{`sum(rate(sm_requests_failed_total[5m])) by (code)`,
			[]promql.Selector{{Name: "sm_requests_failed_total"}}},
		{`histogram_quantile(0.99, sum without (instance) (rate(sm_request_duration_seconds_bucket[5m])))`,
			[]promql.Selector{{Name: "sm_request_duration_seconds_bucket"}}},
		// Binary operators, on/ignoring/group_left clauses, bool, numbers.
		{`process_open_fds / on(job, instance) group_left process_max_fds > bool 0.8`,
			[]promql.Selector{{Name: "process_open_fds"}, {Name: "process_max_fds"}}},
		{`a * ignoring(code) group_right(x, y) b`, []promql.Selector{{Name: "a"}, {Name: "b"}}},
		{`up == 1 and on(job) increase(sm_loop_events_total[2m]) == 0 or absent(up) unless x`,
			[]promql.Selector{{Name: "up"}, {Name: "sm_loop_events_total"}, {Name: "up"}, {Name: "x"}}},
		// Offsets, the @ modifier, subqueries, exponents, Inf.
		{`rate(x[5m] offset 1h) @ end() + max_over_time(y[10m:30s]) * 1e-3 > Inf`,
			[]promql.Selector{{Name: "x"}, {Name: "y"}}},
		{`topk(3, increase(sm_cluster_restarts{cluster!="0"}[15m]))`,
			[]promql.Selector{{Name: "sm_cluster_restarts", Labels: []string{"cluster"}}}},
		{`label_replace(m, "dst", "$1", "src", "(.*)")`, []promql.Selector{{Name: "m"}}},
		{`count_values("generation", sm_cluster_generation)`, []promql.Selector{{Name: "sm_cluster_generation"}}},
		// Names given as matchers, Prometheus 3's quoted names, comments.
		{`{__name__="sm_connections", job="sm"}`, []promql.Selector{{Name: "sm_connections", Labels: []string{"job"}}}},
		{`{"sm.odd.name", "le"="1"}`, []promql.Selector{{Name: "sm.odd.name", Labels: []string{"le"}}}},
		{"sum(a) # the total\n + b", []promql.Selector{{Name: "a"}, {Name: "b"}}},
		// A metric whose name is also a function's, used without parentheses.
		{`time() - timestamp(changes) + time`, []promql.Selector{{Name: "changes"}, {Name: "time"}}},
		// Literals only.
		{`vector(1) + time()`, nil},
	} {
		got, err := promql.Selectors(tc.expr)
		if err != nil {
			t.Errorf("Selectors(%q): %v", tc.expr, err)
			continue
		}
		if !slices.EqualFunc(got, tc.want, func(a, b promql.Selector) bool {
			return a.Name == b.Name && slices.Equal(a.Labels, b.Labels)
		}) {
			t.Errorf("Selectors(%q) = %+v, want %+v", tc.expr, got, tc.want)
		}
	}
}

// A query it cannot read is an error, never a selector quietly missed.
func TestSelectorsErrors(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`rat(sm_requests_forwarded_total[5m])`, "unknown function rat"},
		{`sum(rate(x[5m])`, "unclosed ("},
		{`sum(x))`, "unbalanced )"},
		{`x{job="a"`, "unclosed {"},
		{`x{job}`, "bad label matcher"},
		{`x{job="a" code="b"}`, "expected , or }"},
		{`{job="sm"}`, "no metric name"},
		{`{__name__=~"sm_.*"}`, "no metric name"},
		{`x{job="a}`, "unterminated string"},
		{`sum by job (x)`, "without a label list"},
		{`sum by (rate(x)) (y)`, "in a label list"},
		{`x ; y`, "unexpected"},
		{`x{__name__="y"}`, "two metric names"},
	} {
		_, err := promql.Selectors(tc.expr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Selectors(%q): error %v, want one saying %q", tc.expr, err, tc.want)
		}
	}
}

// A misspelt metric comes back as written, so a check against the exposed
// names catches it: the deliberately bad query.
func TestNamesKeepsMisspelling(t *testing.T) {
	got, err := promql.Names(`sum(rate(sm_requests_forwarded_totl[5m])) / sum(rate(sm_requests_forwarded_total[5m])) + sum(rate(sm_requests_forwarded_total[1m]))`)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"sm_requests_forwarded_total", "sm_requests_forwarded_totl"}; !slices.Equal(got, want) {
		t.Fatalf("Names = %v, want %v (sorted, distinct, the misspelling kept)", got, want)
	}
}
