package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/api"
	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/unixsock"
)

// harnessBin is cluster-harness, built once for the whole test run.
var harnessBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sm-api-test-")
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
	}
	os.Exit(code)
}

const testToken = "test-token-0123456789abcdef"

// testConfig is a small, fast topology (8 shards, 2 per cluster: 4
// clusters), saved to a file so that DEPLOY can re-read it, with the API
// token in a file beside it.
func testConfig(t *testing.T, env map[string]string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Socket = filepath.Join(dir, "sm.sock")
	cfg.Topology = config.Topology{TotalShards: 8, ShardsPerCluster: 2}
	cfg.Cluster.Command = []string{harnessBin, "--simulate", "--connect-delay=5ms", "--event-interval=0"}
	cfg.Cluster.Env = env
	cfg.Heartbeat.Interval = dur(50 * time.Millisecond)
	cfg.Heartbeat.Timeout = dur(600 * time.Millisecond)
	cfg.Restart.BackoffMin = dur(20 * time.Millisecond)
	cfg.Restart.BackoffMax = dur(300 * time.Millisecond)
	cfg.Restart.StopGrace = dur(500 * time.Millisecond)
	cfg.Requests.Timeout = dur(5 * time.Second)
	cfg.Shutdown.Timeout = dur(3 * time.Second)
	cfg.Deploy.ReadyTimeout = dur(5 * time.Second)
	cfg.Deploy.QuiesceTimeout = dur(2 * time.Second)
	cfg.Status.Listen, cfg.Admin.Listen = "", ""
	cfg.Discord.IdentifySpacing = dur(time.Millisecond) // no 5s identify gate between shards
	cfg.API.Listen = "127.0.0.1:0"
	cfg.API.TokenFile = filepath.Join(dir, "api.token")
	cfg.API.TokenEnv = ""
	cfg.API.RequestTimeout = dur(3 * time.Second)
	if err := os.WriteFile(cfg.API.TokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Path = filepath.Join(dir, "sm.toml")
	writeConfig(t, &cfg)
	loaded, err := config.Load(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	return loaded
}

func dur(d time.Duration) config.Duration { return config.Duration{Duration: d} }

// writeConfig saves cfg to cfg.Path, as a DEPLOY re-reads it.
func writeConfig(t *testing.T, cfg *config.Config) {
	t.Helper()
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mgr is a manager running in-process on cfg's socket.
type mgr struct {
	t      *testing.T
	m      *manager.Manager
	cancel context.CancelFunc
	done   chan error
	stoped bool
}

func startManager(t *testing.T, cfg *config.Config) *mgr {
	t.Helper()
	m, err := manager.New(manager.Options{Config: cfg, Logger: testLogger(t, "manager")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := unixsock.Listen(cfg.Socket, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &mgr{t: t, m: m, cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- m.Run(ctx, ln) }()
	t.Cleanup(e.stop)
	return e
}

// stop shuts the manager down (its clusters with it) and waits for it.
func (e *mgr) stop() {
	if e.stoped {
		return
	}
	e.stoped = true
	e.cancel()
	select {
	case err := <-e.done:
		if err != nil {
			e.t.Errorf("manager Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		e.t.Fatal("manager did not stop within 20s")
	}
}

func (e *mgr) status() manager.Status {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := e.m.Status(ctx)
	if err != nil {
		e.t.Fatalf("status: %v", err)
	}
	return st
}

// waitClusters waits until every cluster is routed and, if ready is set, ready.
func (e *mgr) waitReady(ids ...int) manager.Status {
	e.t.Helper()
	var st manager.Status
	waitFor(e.t, 15*time.Second, "clusters ready", func() bool {
		st = e.status()
		for _, id := range ids {
			if c := st.Clusters[id]; c.State != "ready" || !c.Routed {
				return false
			}
		}
		return true
	})
	return st
}

// apiServer is sm-api on a real TCP listener on 127.0.0.1.
type apiServer struct {
	t    *testing.T
	srv  *api.Server
	base string
	hc   *http.Client
}

func startAPI(t *testing.T, cfg *config.Config) *apiServer {
	t.Helper()
	srv, err := api.New(api.Options{Config: cfg, Logger: testLogger(t, "api")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	// A hung request fails the test rather than hanging it.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("api Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("api Run did not return within 10s of cancel")
		}
		hc.CloseIdleConnections()
	})
	return &apiServer{t: t, srv: srv, base: "http://" + ln.Addr().String(), hc: hc}
}

// response is an HTTP answer, read whole.
type response struct {
	code int
	hdr  http.Header
	body []byte
	took time.Duration
}

// errorCode returns the code of an {"error":{...}} body, or "".
func (r response) errorCode() string {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	json.Unmarshal(r.body, &e)
	return e.Error.Code
}

func (r response) String() string {
	return fmt.Sprintf("%d %s (%v)", r.code, bytes.TrimSpace(r.body), r.took.Round(time.Millisecond))
}

// do sends a request with the test token (auth == "") or the given
// Authorization header ("-" for none).
func (a *apiServer) do(method, path, auth string, body []byte) response {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	switch auth {
	case "":
		req.Header.Set("Authorization", "Bearer "+testToken)
	case "-":
	default:
		req.Header.Set("Authorization", auth)
	}
	start := time.Now()
	res, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		a.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{code: res.StatusCode, hdr: res.Header, body: b, took: time.Since(start)}
}

func (a *apiServer) get(path string) response { return a.do("GET", path, "", nil) }

func (a *apiServer) post(path, body string) response {
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	return a.do("POST", path, "", b)
}

// waitSynced waits until sm-api is connected and its state copy in sync.
func (a *apiServer) waitSynced() {
	a.t.Helper()
	waitFor(a.t, 10*time.Second, "sm-api ready and synced", func() bool {
		r := a.do("GET", "/readyz", "-", nil)
		return r.code == 200 && strings.Contains(string(r.body), `"state_synced":true`)
	})
}

// want fails the test unless r has the status and, if code is not "", the error code.
func want(t *testing.T, what string, r response, status int, code string) {
	t.Helper()
	if r.code != status || (code != "" && r.errorCode() != code) {
		t.Fatalf("%s: got %v, want %d %s", what, r, status, code)
	}
	if !strings.HasPrefix(r.hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("%s: Content-Type %q", what, r.hdr.Get("Content-Type"))
	}
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

// testLogger logs to t.Log, tagged by component.
func testLogger(t *testing.T, who string) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("who", who)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// guildOn returns a guild snowflake whose shard is shard under total shards.
func guildOn(shard, total int) uint64 {
	return uint64(1000*total+shard)<<22 | 12345
}

// newServer builds a Server from cfg with no environment.
func newServer(cfg *config.Config) (*api.Server, error) {
	return api.New(api.Options{Config: cfg, Getenv: func(string) string { return "" }})
}
