package manager_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// TestMain builds nats-server from its Go module too, for the mesh tests.
func TestMain(m *testing.M) {
	testenv.Main(m, "../cmd/cluster-harness", "../cmd/sm-manager", "github.com/nats-io/nats-server/v2")
}

// env is a running manager on a socket in a temp dir.
type env struct {
	*testenv.Manager
	t   *testing.T
	cfg *config.Config
	reg *prometheus.Registry
}

// testConfig is testenv's topology, with its state in a temp dir.
func testConfig(t *testing.T) *config.Config {
	cfg := testenv.Config(t.TempDir())
	cfg.State.Dir = filepath.Join(t.TempDir(), "state")
	return cfg
}

// runFirst makes cfg's cluster command a script that, for that cluster only,
// runs shell before it execs the harness (shell may exec something else
// instead).
func runFirst(t *testing.T, cfg *config.Config, cluster int, shell string) {
	t.Helper()
	script := filepath.Join(t.TempDir(), "cluster.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"+
		"if [ \"$SM_CLUSTER\" = "+strconv.Itoa(cluster)+" ]; then "+shell+"; fi\n"+
		"exec '"+testenv.Bin("cluster-harness")+"' \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.Cluster.Command = append([]string{script}, cfg.Cluster.Command[1:]...)
}

func start(t *testing.T, cfg *config.Config) *env {
	t.Helper()
	return startWith(t, cfg, manager.Options{})
}

// startWith is start with extra options (a /gateway/bot answer, say).
func startWith(t *testing.T, cfg *config.Config, opts manager.Options) *env {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts.Config, opts.Logger, opts.Registry = cfg, testenv.Logger(t, slog.LevelDebug), reg
	return &env{Manager: testenv.StartManager(t, opts), t: t, cfg: cfg, reg: reg}
}

// killAndRespawn SIGKILLs pid, a process of cluster, and waits until another
// process of the cluster is ready and routed; it returns that one's pid.
func (e *env) killAndRespawn(cluster, pid int) int {
	e.t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		e.t.Fatal(err)
	}
	var now int
	testenv.WaitFor(e.t, 10*time.Second, fmt.Sprintf("cluster %d respawned", cluster), func() bool {
		cs := e.MustStatus().Clusters[cluster]
		now = cs.PID
		return cs.PID != pid && cs.Routed && cs.State == "ready"
	})
	return now
}

// client registers a client connection.
func (e *env) client(name string) *ipc.Client { return testenv.Dial(e.t, e.cfg.Socket, name) }

// request sends one business op and returns the reply.
func request(t *testing.T, c *ipc.Client, op, target string, payload any, timeout time.Duration) (*ipc.Frame, error) {
	t.Helper()
	var raw json.RawMessage
	if payload != nil {
		b, ok := payload.([]byte)
		if !ok {
			b, _ = json.Marshal(payload)
		}
		raw = b
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Request(ctx, &ipc.Frame{Op: op, Target: target, Payload: raw})
}

func durationOf(d time.Duration) config.Duration { return config.Duration{Duration: d} }
