package manager_test

import (
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// Requests with the default timeout share one deadline list and timer
// (manager/deadline.go). Each must still time out on its own deadline: not
// before it, and not long after, whatever its neighbours do.
func TestSharedDeadlines(t *testing.T) {
	cfg := testConfig(t)
	const timeout = 400 * time.Millisecond
	cfg.Requests.Timeout = durationOf(timeout)
	cfg.Cluster.Command = append(cfg.Cluster.Command, "--op-delay=3s")
	e := start(t, cfg)
	e.WaitReady()
	c := e.client("t")

	var wg sync.WaitGroup
	type result struct {
		elapsed time.Duration
		err     error
	}
	results := make([]result, 6)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := c.Request(t.Context(), &ipc.Frame{Op: "ping", Target: "1"})
			results[i] = result{time.Since(start), err}
		}()
		time.Sleep(100 * time.Millisecond) // staggered: each has its own deadline
	}
	wg.Wait()
	for i, r := range results {
		if ipc.CodeOf(r.err) != ipc.CodeTimeout {
			t.Errorf("request %d: %v, want timeout", i, r.err)
			continue
		}
		if r.elapsed < timeout || r.elapsed > timeout+time.Second {
			t.Errorf("request %d timed out after %v, want %v (plus scheduling)", i, r.elapsed, timeout)
		}
	}
	// The list is empty again and the manager still routes: a request with
	// a longer op than its deadline, then the list's timer re-armed.
	start := time.Now()
	if _, err := c.Request(t.Context(), &ipc.Frame{Op: "ping", Target: "2"}); ipc.CodeOf(err) != ipc.CodeTimeout || time.Since(start) < timeout {
		t.Errorf("after the burst: %v after %v, want timeout after %v", err, time.Since(start), timeout)
	}
}
