package statusws_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/statusws"
)

// TestMain builds nats-server from its Go module too, for the mesh page test.
func TestMain(m *testing.M) {
	testenv.Main(m, "../cmd/cluster-harness", "github.com/nats-io/nats-server/v2")
}

// testConfig is testenv's small, fast topology: 8 shards, 2 per cluster, 4 clusters.
func testConfig(t *testing.T) *config.Config { return testenv.Config(t.TempDir()) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func dur(d time.Duration) config.Duration { return config.Duration{Duration: d} }

// env is a running manager with a status server in front of it.
type env struct {
	*testenv.Manager
	t         *testing.T
	cfg       *config.Config
	url       string // http://127.0.0.1:port
	transport *http.Transport
	// stopServer stops the status server and checks Run returned nil.
	stopServer func()
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
	log := testenv.Logger(t, slog.LevelInfo)
	m := testenv.StartManager(t, manager.Options{Config: cfg, Logger: log.With("c", "manager")})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv.Feed = m.Manager
	srv.Logger = log.With("c", "statusws")
	srv.Buffer = cfg.Limits.FeedBuffer
	e := &env{Manager: m, t: t, cfg: cfg, url: "http://" + ln.Addr().String(), transport: &http.Transport{}}
	e.stopServer = testenv.Serve(t, "status server", 15*time.Second, func(ctx context.Context) error { return srv.Run(ctx, ln) })
	t.Cleanup(func() {
		e.Stop()
		e.stopServer()
		e.transport.CloseIdleConnections()
	})
	return e
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
