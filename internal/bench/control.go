package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// What the manager-kill, scale and soak scenarios do over a fleet's control
// client (see fleet.go): STATUS and DEPLOY; and what they read of the manager
// besides: its metrics endpoint, its fds, the machine's free memory.

// mgrStatus asks the manager for a STATUS snapshot.
func mgrStatus(ctx context.Context, c *ipc.Client, timeout time.Duration) (manager.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var st manager.Status
	r, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpStatus})
	if err != nil {
		return st, fmt.Errorf("STATUS: %w", err)
	}
	if err := json.Unmarshal(r.Payload, &st); err != nil {
		return st, fmt.Errorf("STATUS reply: %w", err)
	}
	return st, nil
}

// readyCount is how many clusters have a ready, routed process.
func readyCount(st manager.Status) int {
	n := 0
	for _, c := range st.Clusters {
		if c.Routed && c.State == "ready" {
			n++
		}
	}
	return n
}

// clusterPIDs is each cluster's process id (0 for none), by cluster.
func clusterPIDs(st manager.Status) []int {
	pids := make([]int, len(st.Clusters))
	for i, c := range st.Clusters {
		pids[i] = c.PID
	}
	return pids
}

// waitAllReady polls STATUS every poll until every cluster is ready and
// routed, and returns that snapshot. progress, if set, is called with each.
func waitAllReady(ctx context.Context, c *ipc.Client, timeout, poll time.Duration, exited <-chan struct{}, progress func(manager.Status)) (manager.Status, error) {
	deadline := time.Now().Add(timeout)
	var last error
	var st manager.Status
	for {
		var err error
		st, err = mgrStatus(ctx, c, max(5*time.Second, poll))
		if err == nil {
			if progress != nil {
				progress(st)
			}
			if readyCount(st) == len(st.Clusters) && len(st.Clusters) > 0 {
				return st, nil
			}
			last = fmt.Errorf("%d of %d clusters ready", readyCount(st), len(st.Clusters))
		} else {
			last = err
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("not every cluster ready after %v: %w", timeout, last)
		}
		select {
		case <-exited:
			return st, fmt.Errorf("sm-manager exited (see its log): %w", last)
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// mgrDeploy sends DEPLOY (all clusters if clusters is nil) and waits, polling
// STATUS, until that deploy has finished. It returns its final status.
func mgrDeploy(ctx context.Context, c *ipc.Client, clusters []int, maxParallel int, timeout, poll time.Duration) (*generation.Status, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	r, err := c.Request(rctx, &ipc.Frame{Op: ipc.OpDeploy, Clusters: clusters, MaxParallel: maxParallel})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("DEPLOY: %w", err)
	}
	var started struct {
		DeployID string `json:"deploy_id"`
	}
	if err := json.Unmarshal(r.Payload, &started); err != nil || started.DeployID == "" {
		return nil, fmt.Errorf("DEPLOY reply %s: no deploy_id (%v)", r.Payload, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		if err := sleep(ctx, poll); err != nil {
			return nil, err
		}
		st, err := mgrStatus(ctx, c, 10*time.Second)
		if err == nil && st.Deploy != nil && st.Deploy.ID == started.DeployID && !st.Deploy.Finished.IsZero() {
			d := st.Deploy
			if d.State != generation.StateSucceeded {
				return d, fmt.Errorf("deploy %s %s: %s", d.ID, d.State, d.Reason)
			}
			return d, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("deploy %s not finished after %v (last STATUS error: %v)", started.DeployID, timeout, err)
		}
	}
}

// scrapeMetrics reads the named metrics (unlabelled gauges, as the Go and
// process collectors export them) from a Prometheus text endpoint.
func scrapeMetrics(ctx context.Context, addr string, names ...string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	// A bare HTTP/1.0 GET: net/http's client keeps idle connections and
	// goroutines around, which would blur a soak's own picture.
	fmt.Fprintf(nc, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr)
	body, err := io.ReadAll(nc)
	if err != nil {
		return nil, err
	}
	head, rest, ok := bytes.Cut(body, []byte("\r\n\r\n"))
	if !ok || !bytes.HasPrefix(head, []byte("HTTP/1.")) || !bytes.Contains(bytes.SplitN(head, []byte("\r\n"), 2)[0], []byte(" 200 ")) {
		return nil, fmt.Errorf("GET http://%s/metrics: %.80q", addr, head)
	}
	return parseMetrics(rest, names...)
}

// parseMetrics picks the named unlabelled samples out of Prometheus text.
func parseMetrics(text []byte, names ...string) (map[string]float64, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok || !want[name] {
			continue
		}
		val, _, _ = strings.Cut(strings.TrimSpace(val), " ") // a timestamp may follow
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s: %q", name, val)
		}
		out[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return out, fmt.Errorf("metric %s not exported", n)
		}
	}
	return out, nil
}

// countFDs is the number of open file descriptors of pid.
func countFDs(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}

// memAvailableKiB is MemAvailable from /proc/meminfo.
func memAvailableKiB() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("/proc/meminfo: no MemAvailable")
}
