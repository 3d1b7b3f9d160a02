// Package natstest runs real nats-server processes for tests: JetStream on,
// its store in the test's temporary directory, listening on loopback (or on
// an address inside a network namespace), stopped when the test ends.
package natstest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Options shape one server.
type Options struct {
	// Bin is the nats-server binary (testenv.Bin("nats-server") once
	// testenv.Main has built github.com/nats-io/nats-server/v2).
	Bin string
	// Host is the address it listens on: 127.0.0.1 when empty.
	Host string
	// Port is its port; 0 picks a free one.
	Port int
	// Auth is a server configuration block added as it is, such as
	// `authorization { token: "s3cret" }`.
	Auth string
	// Exec, when set, wraps the command: Exec("ip", "netns", "exec", ns)
	// runs the server inside a namespace.
	Exec []string
	// StoreDir is JetStream's store; a new temporary directory when empty.
	// Reusing one across a restart keeps the buckets.
	StoreDir string
	// Extra is more server configuration, added as it is (StartCluster's
	// server_name and cluster block).
	Extra string
}

// Server is one running nats-server.
type Server struct {
	// URL is where clients connect: nats://host:port.
	URL string
	// Port is the port it listens on (kept across Restart).
	Port int

	t    testing.TB
	opts Options
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a server and waits until it accepts connections. The test's
// cleanup stops it.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.StoreDir == "" {
		opts.StoreDir = t.TempDir()
	}
	s := &Server{t: t, opts: opts}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	t := s.t
	t.Helper()
	dir := t.TempDir()
	port := -1
	if s.Port != 0 {
		port = s.Port
	} else if s.opts.Port != 0 {
		port = s.opts.Port
	}
	conf := fmt.Sprintf("listen: %q\njetstream { store_dir: %q }\nports_file_dir: %q\n%s\n%s\n",
		fmt.Sprintf("%s:%d", s.opts.Host, port), s.opts.StoreDir, dir, s.opts.Auth, s.opts.Extra)
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, s.opts.Exec...), s.opts.Bin, "-c", path)
	cmd := exec.Command(args[0], args[1:]...)
	log, err := os.Create(filepath.Join(dir, "nats.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting nats-server: %v", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.done) }()

	// nats-server writes its ports, once it listens, to <name>_<pid>.ports.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if url, ok := portsFile(dir); ok {
			s.URL = url
			if i := strings.LastIndexByte(url, ':'); i >= 0 {
				_, _ = fmt.Sscan(url[i+1:], &s.Port)
			}
			return
		}
		select {
		case <-s.done:
			b, _ := os.ReadFile(filepath.Join(dir, "nats.log"))
			t.Fatalf("nats-server exited at start: %s", b)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			t.Fatal("nats-server did not listen within 20s")
		}
	}
}

func portsFile(dir string) (string, bool) {
	m, _ := filepath.Glob(filepath.Join(dir, "*.ports"))
	if len(m) == 0 {
		return "", false
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		return "", false
	}
	var p struct {
		Nats []string `json:"nats"`
	}
	if json.Unmarshal(b, &p) != nil || len(p.Nats) == 0 {
		return "", false
	}
	return p.Nats[0], true
}

// Stop stops the server (SIGTERM, then SIGKILL after 5 s) and waits for it.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Kill ends the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Restart starts the server again on the same port with the same store.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}
