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
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/api"
	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/manager"
)

// TestMain builds nats-server from its Go module too, for the mesh test.
func TestMain(m *testing.M) {
	testenv.Main(m, "../cmd/cluster-harness", "github.com/nats-io/nats-server/v2")
}

const testToken = "test-token-0123456789abcdef"

// testConfig is a small, fast topology (8 shards, 2 per cluster: 4
// clusters), saved to a file so that DEPLOY can re-read it, with the API
// token in a file beside it.
func testConfig(t *testing.T, env map[string]string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	cfg := testenv.Config(dir)
	cfg.Cluster.Env = env
	cfg.Requests.Timeout = dur(5 * time.Second)
	cfg.Deploy.ReadyTimeout = dur(5 * time.Second)
	cfg.Deploy.QuiesceTimeout = dur(2 * time.Second)
	cfg.API.Listen = "127.0.0.1:0"
	cfg.API.TokenFile = filepath.Join(dir, "api.token")
	cfg.API.TokenEnv = ""
	cfg.API.RequestTimeout = dur(3 * time.Second)
	if err := os.WriteFile(cfg.API.TokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Path = filepath.Join(dir, "sm.toml")
	testenv.WriteConfig(t, cfg)
	loaded, err := config.Load(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	return loaded
}

func dur(d time.Duration) config.Duration { return config.Duration{Duration: d} }

// startManager runs a manager on cfg's socket until the test ends.
func startManager(t *testing.T, cfg *config.Config) *testenv.Manager {
	t.Helper()
	return testenv.StartManager(t, manager.Options{Config: cfg, Logger: testLogger(t, "manager")})
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
	stop := testenv.Serve(t, "api", 10*time.Second, func(ctx context.Context) error { return srv.Run(ctx, ln) })
	// A hung request fails the test rather than hanging it.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	t.Cleanup(func() {
		stop()
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
	testenv.WaitFor(a.t, 10*time.Second, "sm-api ready and synced", func() bool {
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

// testLogger logs to t.Log, tagged by component.
func testLogger(t *testing.T, who string) *slog.Logger {
	return testenv.Logger(t, slog.LevelInfo).With("who", who)
}

// guildOn returns a guild snowflake whose shard is shard under total shards.
func guildOn(shard, total int) uint64 {
	return uint64(1000*total+shard)<<22 | 12345
}

// newServer builds a Server from cfg with no environment.
func newServer(cfg *config.Config) (*api.Server, error) {
	return api.New(api.Options{Config: cfg, Getenv: func(string) string { return "" }})
}
