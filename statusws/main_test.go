package statusws_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/statusws"
	"github.com/sm-supervisor/sm/unixsock"
)

// harnessBin is cluster-harness, built once for the whole test run.
var harnessBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sm-statusws-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	harnessBin = filepath.Join(dir, "cluster-harness")
	build := exec.Command("go", "build", "-o", harnessBin, "../cmd/cluster-harness")
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
		if z := leftovers(); len(z) > 0 {
			fmt.Fprintln(os.Stderr, "processes left behind:", z)
			code = 1
		}
	}
	os.Exit(code)
}

// leftovers lists processes still running the test's harness binary, and
// zombie children of this process.
func leftovers() []string {
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
		s := string(stat) // pid (comm) state ppid ...
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
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

// testConfig is a small, fast topology: 8 shards, 2 per cluster, 4 clusters.
func testConfig(t *testing.T) *config.Config {
	cfg := config.Default()
	cfg.Socket = filepath.Join(t.TempDir(), "sm.sock")
	cfg.Topology = config.Topology{TotalShards: 8, ShardsPerCluster: 2}
	cfg.Cluster.Command = []string{harnessBin, "--simulate", "--connect-delay=5ms", "--event-interval=0"}
	cfg.Heartbeat.Interval = dur(50 * time.Millisecond)
	cfg.Heartbeat.Timeout = dur(600 * time.Millisecond)
	cfg.Restart.BackoffMin = dur(20 * time.Millisecond)
	cfg.Restart.BackoffMax = dur(300 * time.Millisecond)
	cfg.Restart.StopGrace = dur(500 * time.Millisecond)
	cfg.Requests.Timeout = dur(3 * time.Second)
	cfg.Shutdown.Timeout = dur(3 * time.Second)
	cfg.Discord.IdentifySpacing = dur(time.Millisecond) // no 5s identify gate between shards
	cfg.Status.Listen, cfg.Admin.Listen = "", ""        // the test makes its own listener
	return &cfg
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func dur(d time.Duration) config.Duration { return config.Duration{Duration: d} }

// env is a running manager with a status server in front of it.
type env struct {
	t         *testing.T
	cfg       *config.Config
	m         *manager.Manager
	url       string // http://127.0.0.1:port
	stopMgr   context.CancelFunc
	mgrDone   chan error
	stopSrv   context.CancelFunc
	srvDone   chan error
	transport *http.Transport
}

// start runs a manager from cfg and a statusws.Server on a loopback port.
func start(t *testing.T, cfg *config.Config, origins ...string) *env {
	t.Helper()
	return startServer(t, cfg, &statusws.Server{AllowedOrigins: origins})
}

// startServer is start with srv's fields (Feed, Logger and Buffer are set here).
func startServer(t *testing.T, cfg *config.Config, srv *statusws.Server) *env {
	t.Helper()
	return startAt(t, cfg, srv, "127.0.0.1:0")
}

// startAt is startServer with the status server listening on addr.
func startAt(t *testing.T, cfg *config.Config, srv *statusws.Server, addr string) *env {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	m, err := manager.New(manager.Options{Config: cfg, Logger: log.With("c", "manager")})
	if err != nil {
		t.Fatal(err)
	}
	uln, err := unixsock.Listen(cfg.Socket, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv.Feed = m
	srv.Logger = log.With("c", "statusws")
	srv.Buffer = cfg.Limits.FeedBuffer
	mctx, stopMgr := context.WithCancel(context.Background())
	sctx, stopSrv := context.WithCancel(context.Background())
	e := &env{
		t: t, cfg: cfg, m: m, url: "http://" + ln.Addr().String(),
		stopMgr: stopMgr, mgrDone: make(chan error, 1),
		stopSrv: stopSrv, srvDone: make(chan error, 1),
		transport: &http.Transport{},
	}
	go func() { e.mgrDone <- m.Run(mctx, uln) }()
	go func() { e.srvDone <- srv.Run(sctx, ln) }()
	t.Cleanup(func() {
		e.stopManager()
		e.stopServer()
		e.transport.CloseIdleConnections()
	})
	return e
}

// stopManager stops the manager (as SIGTERM does) and checks Run returned nil.
func (e *env) stopManager() {
	e.stopMgr()
	e.wait("manager", e.mgrDone, 20*time.Second)
}

// stopServer stops the status server and checks Run returned nil.
func (e *env) stopServer() {
	e.stopSrv()
	e.wait("status server", e.srvDone, 15*time.Second)
}

func (e *env) wait(what string, done chan error, timeout time.Duration) {
	select {
	case err := <-done:
		if err != nil {
			e.t.Errorf("%s Run: %v", what, err)
		}
		done <- nil // a second stop returns at once
	case <-time.After(timeout):
		e.t.Fatalf("%s did not stop within %v", what, timeout)
	}
}

func (e *env) wsURL() string { return "ws" + strings.TrimPrefix(e.url, "http") + "/ws" }

// dial opens a WebSocket to the feed; it is closed when the test ends.
func (e *env) dial(opts *websocket.DialOptions) *websocket.Conn {
	e.t.Helper()
	c, resp, err := e.tryDial(opts)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		e.t.Fatalf("dial %s: %v (HTTP %d)", e.wsURL(), err, status)
	}
	return c
}

func (e *env) tryDial(opts *websocket.DialOptions) (*websocket.Conn, *http.Response, error) {
	if opts == nil {
		opts = &websocket.DialOptions{}
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Transport: e.transport}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, e.wsURL(), opts)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return nil, resp, err
	}
	c.SetReadLimit(4 << 20) // snapshots of big topologies
	e.t.Cleanup(func() { c.CloseNow() })
	return c, resp, nil
}

// event is a feed event, with its bytes as they came.
type event struct {
	Type       string          `json:"type"`
	Cluster    json.RawMessage `json:"cluster"`
	Generation int64           `json:"generation"`
	PID        int             `json:"pid"`
	Ready      bool            `json:"ready"`
	At         time.Time       `json:"at"`
	Payload    json.RawMessage `json:"payload"`
	Status     *manager.Status `json:"status"`
	Deploy     json.RawMessage `json:"deploy"`

	raw []byte
}

// clusterEvent is the "cluster" of a cluster event.
func (ev *event) clusterStatus(t *testing.T) manager.ClusterStatus {
	t.Helper()
	var cs manager.ClusterStatus
	if err := json.Unmarshal(ev.Cluster, &cs); err != nil {
		t.Fatalf("cluster event %s: %v", ev.raw, err)
	}
	return cs
}

// heartbeatCluster is the cluster id of a heartbeat event.
func (ev *event) heartbeatCluster(t *testing.T) int {
	t.Helper()
	n, err := strconv.Atoi(string(ev.Cluster))
	if err != nil {
		t.Fatalf("heartbeat event %s: cluster is not a number", ev.raw)
	}
	return n
}

// read reads one event, failing the test after timeout.
func read(t *testing.T, c *websocket.Conn, timeout time.Duration) *event {
	t.Helper()
	ev, err := tryRead(c, timeout)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return ev
}

func tryRead(c *websocket.Conn, timeout time.Duration) (*event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	typ, b, err := c.Read(ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		return nil, fmt.Errorf("got a %v message, want text", typ)
	}
	ev := &event{raw: b}
	if err := json.Unmarshal(b, ev); err != nil {
		return nil, fmt.Errorf("event %s: %w", b, err)
	}
	return ev, nil
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
