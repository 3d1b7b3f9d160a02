package systemd_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/ipc"
)

// Binaries built once for the whole run, into binDir (which the real-systemd
// tests also hand to the container).
var (
	binDir      string
	managerBin  string
	harnessBin  string
	clientBin   string
	apiBin      string // "" when cmd/sm-api does not build (yet)
	apiBuildErr string
)

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "sm-systemd-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer os.RemoveAll(dir)
		binDir = dir
		managerBin = filepath.Join(dir, "sm-manager")
		harnessBin = filepath.Join(dir, "cluster-harness")
		clientBin = filepath.Join(dir, "smclient")
		build := exec.Command("go", "build", "-o", dir+"/", "./cmd/sm-manager", "./cmd/cluster-harness", "./systemd/testdata/smclient")
		build.Dir = ".."
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build:", err)
			return 2
		}
		// sm-api is only installed for systemd-analyze verify, which needs
		// every ExecStart= binary to exist.
		api := exec.Command("go", "build", "-o", filepath.Join(dir, "sm-api"), "./cmd/sm-api")
		api.Dir = ".."
		if out, err := api.CombinedOutput(); err != nil {
			apiBuildErr = strings.TrimSpace(string(out))
		} else {
			apiBin = filepath.Join(dir, "sm-api")
		}
		code := m.Run()
		if code == 0 {
			if err := goleak.Find(); err != nil {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				code = 1
			}
			if left := harnessProcesses(); len(left) > 0 {
				fmt.Fprintln(os.Stderr, "cluster processes left behind:", left)
				code = 1
			}
		}
		return code
	}()
	os.Exit(code)
}

// harnessProcesses lists processes still running the test's harness binary.
func harnessProcesses() []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == harnessBin {
			out = append(out, pid)
		}
	}
	return out
}

// shortDir is a temp dir with a short path: Unix socket paths hold 107 bytes,
// and t.TempDir's are named after the test.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "smsd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// testConfig is a small, fast topology: 8 shards, 2 per cluster, 4 clusters,
// with no TCP listeners (tests run side by side).
func testConfig(dir string) *config.Config {
	cfg := config.Default()
	cfg.Socket = filepath.Join(dir, "sm.sock")
	cfg.Topology = config.Topology{TotalShards: 8, ShardsPerCluster: 2}
	cfg.Cluster.Command = []string{harnessBin, "--simulate", "--connect-delay=5ms", "--event-interval=0"}
	cfg.Heartbeat.Interval = config.Duration{Duration: 50 * time.Millisecond}
	cfg.Heartbeat.Timeout = config.Duration{Duration: 3 * time.Second}
	cfg.Restart.BackoffMin = config.Duration{Duration: 20 * time.Millisecond}
	cfg.Restart.BackoffMax = config.Duration{Duration: 300 * time.Millisecond}
	cfg.Restart.StopGrace = config.Duration{Duration: 500 * time.Millisecond}
	cfg.Requests.Timeout = config.Duration{Duration: 3 * time.Second}
	cfg.Shutdown.Timeout = config.Duration{Duration: 3 * time.Second}
	cfg.Status.Listen = ""
	cfg.Admin.Listen = ""
	// The simulated bot has no real gateway: no need for Discord's 5s.
	cfg.Discord.IdentifySpacing = config.Duration{Duration: time.Millisecond}
	return &cfg
}

// sdMsg is one datagram a fake service manager received.
type sdMsg struct {
	at   time.Time
	raw  string
	vars map[string]string
}

func (m sdMsg) has(kv string) bool {
	k, v, _ := strings.Cut(kv, "=")
	got, ok := m.vars[k]
	return ok && got == v
}

// fakeSD is a service manager's NOTIFY_SOCKET: a datagram socket that keeps
// every message it receives.
type fakeSD struct {
	t    *testing.T
	path string
	conn *net.UnixConn
	done chan struct{}

	mu   sync.Mutex
	msgs []sdMsg
}

func newFakeSD(t *testing.T) *fakeSD {
	t.Helper()
	path := filepath.Join(shortDir(t), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSD{t: t, path: path, conn: conn, done: make(chan struct{})}
	go f.read()
	t.Cleanup(func() {
		conn.Close()
		<-f.done
	})
	return f
}

func (f *fakeSD) read() {
	defer close(f.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := f.conn.Read(buf)
		if err != nil {
			return
		}
		m := sdMsg{at: time.Now(), raw: string(buf[:n]), vars: map[string]string{}}
		for line := range strings.SplitSeq(m.raw, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				m.vars[k] = v
			}
		}
		f.mu.Lock()
		f.msgs = append(f.msgs, m)
		f.mu.Unlock()
	}
}

// all returns every message so far.
func (f *fakeSD) all() []sdMsg {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sdMsg(nil), f.msgs...)
}

// waitMsg waits for the first message from index from on that matches, and
// returns its index.
func (f *fakeSD) waitMsg(from int, timeout time.Duration, what string, match func(sdMsg) bool) (int, sdMsg) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msgs := f.all()
		for i := from; i < len(msgs); i++ {
			if match(msgs[i]) {
				return i, msgs[i]
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("no %s within %v; messages: %q", what, timeout, raws(msgs))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pings returns the times of the WATCHDOG=1 messages in [from, to).
func (f *fakeSD) pings(from, to time.Time) []time.Time {
	var out []time.Time
	for _, m := range f.all() {
		if m.has("WATCHDOG=1") && !m.at.Before(from) && m.at.Before(to) {
			out = append(out, m.at)
		}
	}
	return out
}

func raws(msgs []sdMsg) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.raw
	}
	return out
}

// echoAll registers a client on socket and echoes once through every cluster.
func echoAll(t *testing.T, socket string, clusters int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{Path: socket, Register: ipc.Frame{Role: ipc.RoleClient, Name: "systemd-test"}})
	if err != nil {
		t.Fatalf("dial and REGISTER: %v", err)
	}
	defer c.Close()
	for i := range clusters {
		want := fmt.Sprintf(`{"n":%d}`, i)
		for {
			reply, err := c.Request(ctx, &ipc.Frame{Op: "echo", Target: strconv.Itoa(i), Payload: []byte(want)})
			if err == nil {
				if string(reply.Payload) != want {
					t.Fatalf("echo to cluster %d: got %s, want %s", i, reply.Payload, want)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("echo to cluster %d: %v", i, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
