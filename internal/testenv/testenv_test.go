package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMetrics(t *testing.T) {
	const scrape = `# TYPE sm_connections gauge
sm_connections 5
# TYPE sm_requests_total counter
sm_requests_total{code="ok",op="ping"} 7
# TYPE sm_latency_seconds histogram
sm_latency_seconds_bucket{op="ping",le="+Inf"} 3
sm_latency_seconds_sum{op="ping"} 0.5
sm_latency_seconds_count{op="ping"} 3
`
	got, err := Metrics(strings.NewReader(scrape))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"sm_connections":                     5,
		"sm_requests_total{code=ok,op=ping}": 7,
		"sm_latency_seconds_count{op=ping}":  3,
	}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if _, err := Metrics(strings.NewReader("not a scrape {")); err == nil {
		t.Error("a broken scrape parsed")
	}
}

// leftovers finds an unreaped child, and a process running a binary from dir.
func TestLeftovers(t *testing.T) {
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	saved := dir
	dir = d
	defer func() { dir = saved }()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "sleep"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(); len(left) > 0 {
		t.Fatalf("leftovers before the test: %v", left)
	}

	orphan := exec.Command(filepath.Join(d, "sleep"), "30")
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	want := "orphan " + strconv.Itoa(orphan.Process.Pid) + " sleep"
	if left := leftovers(); len(left) != 1 || left[0] != want {
		t.Errorf("with a running binary: %v, want [%s]", left, want)
	}
	orphan.Process.Kill()
	WaitFor(t, 5*time.Second, "the killed sleep to turn zombie", func() bool {
		left := leftovers()
		return len(left) == 1 && left[0] == "zombie "+strconv.Itoa(orphan.Process.Pid)
	})
	orphan.Wait()
	if left := leftovers(); len(left) > 0 {
		t.Fatalf("leftovers after Wait: %v", left)
	}
}
