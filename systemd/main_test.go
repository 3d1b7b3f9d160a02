package systemd_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// The binaries are built once for the whole run, into testenv.Dir (which the
// real-systemd tests also hand to the container). sm-api is there for
// systemd-analyze verify, which needs every ExecStart= binary to exist.
func TestMain(m *testing.M) {
	testenv.Main(m, "../cmd/sm-manager", "../cmd/cluster-harness", "../cmd/sm-api", "./testdata/smclient")
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

// testConfig is testenv's small, fast topology in dir, with a heartbeat
// timeout for real processes started side by side.
func testConfig(dir string) *config.Config {
	cfg := testenv.Config(dir)
	cfg.Heartbeat.Timeout = config.Duration{Duration: 3 * time.Second}
	return cfg
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
	c := testenv.Dial(t, socket, "systemd-test")
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
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

func testLogger(t *testing.T) *slog.Logger { return testenv.Logger(t, slog.LevelDebug) }
