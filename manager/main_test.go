package manager_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/unixsock"
)

// harnessBin is cluster-harness and managerBin sm-manager, built once for the
// whole test run.
var harnessBin, managerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sm-manager-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	harnessBin = filepath.Join(dir, "cluster-harness")
	managerBin = filepath.Join(dir, "sm-manager")
	build := exec.Command("go", "build", "-o", dir+"/", "../cmd/cluster-harness", "../cmd/sm-manager")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build cluster-harness:", err)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
		if z := zombies(); len(z) > 0 {
			fmt.Fprintln(os.Stderr, "zombie or orphan cluster processes left:", z)
			code = 1
		}
	}
	os.Exit(code)
}

// zombies lists processes still running the test's harness binary, or zombie
// children of this process.
func zombies() []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		rest := s[strings.LastIndexByte(s, ')')+2:]
		fields := strings.Fields(rest)
		if len(fields) < 2 {
			continue
		}
		if fields[0] == "Z" && fields[1] == self {
			out = append(out, "zombie "+e.Name())
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == harnessBin {
			out = append(out, "orphan "+e.Name())
		}
	}
	return out
}

// env is a running manager on a socket in a temp dir.
type env struct {
	t      *testing.T
	cfg    *config.Config
	m      *manager.Manager
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// testConfig is a small, fast topology: 8 shards, 2 per cluster, 4 clusters.
func testConfig(t *testing.T) *config.Config {
	cfg := config.Default()
	cfg.Socket = filepath.Join(t.TempDir(), "sm.sock")
	cfg.Topology = config.Topology{TotalShards: 8, ShardsPerCluster: 2}
	cfg.Cluster.Command = []string{harnessBin, "--simulate", "--connect-delay=5ms", "--event-interval=0"}
	cfg.Heartbeat.Interval = config.Duration{Duration: 50 * time.Millisecond}
	cfg.Heartbeat.Timeout = config.Duration{Duration: 600 * time.Millisecond}
	cfg.Restart.BackoffMin = config.Duration{Duration: 20 * time.Millisecond}
	cfg.Restart.BackoffMax = config.Duration{Duration: 300 * time.Millisecond}
	cfg.Restart.StopGrace = config.Duration{Duration: 500 * time.Millisecond}
	cfg.Requests.Timeout = config.Duration{Duration: 3 * time.Second}
	cfg.Shutdown.Timeout = config.Duration{Duration: 3 * time.Second}
	cfg.State.Dir = filepath.Join(t.TempDir(), "state")
	cfg.Discord.IdentifySpacing = config.Duration{Duration: time.Millisecond}
	cfg.Status.Listen, cfg.Admin.Listen = "", ""
	return &cfg
}

func start(t *testing.T, cfg *config.Config) *env {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := prometheus.NewRegistry()
	m, err := manager.New(manager.Options{Config: cfg, Logger: log, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := unixsock.Listen(cfg.Socket, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &env{t: t, cfg: cfg, m: m, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- m.Run(ctx, ln) }()
	t.Cleanup(e.stop)
	return e
}

// stop shuts the manager down and checks it stopped cleanly.
func (e *env) stop() {
	e.cancel()
	select {
	case err := <-e.done:
		if err != nil {
			e.t.Errorf("manager Run: %v", err)
		}
		e.done <- nil
	case <-time.After(20 * time.Second):
		e.t.Fatal("manager did not stop within 20s")
	}
}

// client registers a client connection.
func (e *env) client(name string) *ipc.Client {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{Path: e.cfg.Socket, Register: ipc.Frame{Role: ipc.RoleClient, Name: name}})
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

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

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) status() manager.Status {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := e.m.Status(ctx)
	if err != nil {
		e.t.Fatalf("status: %v", err)
	}
	return st
}

// waitAllReady waits until every cluster is routed and ready.
func (e *env) waitAllReady() manager.Status {
	e.t.Helper()
	var st manager.Status
	waitFor(e.t, 15*time.Second, "all clusters ready", func() bool {
		st = e.status()
		for _, c := range st.Clusters {
			if c.State != "ready" || !c.Routed {
				return false
			}
		}
		return true
	})
	return st
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func durationOf(d time.Duration) config.Duration { return config.Duration{Duration: d} }
