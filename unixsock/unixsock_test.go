package unixsock_test

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/unixsock"
)

// helperDialEnv names the socket a re-executed test binary dials, as a peer
// in another process (go-plugin's helper-process pattern).
const helperDialEnv = "SM_UNIXSOCK_TEST_DIAL"

func TestMain(m *testing.M) {
	if path := os.Getenv(helperDialEnv); path != "" {
		os.Exit(helperDial(path))
	}
	goleak.VerifyTestMain(m)
}

// helperDial connects to path and holds the connection until the other end
// closes it.
func helperDial(path string) int {
	c, err := net.Dial("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	io.Copy(io.Discard, c)
	return 0
}

// sockPath is a socket path in a fresh directory, short enough for sun_path.
func sockPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "sm.sock")
}

func listen(t *testing.T, path string, mode os.FileMode) *unixsock.Listener {
	t.Helper()
	ln, err := unixsock.Listen(path, mode)
	if err != nil {
		t.Fatalf("Listen(%s, %v): %v", path, mode, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// roundTrip dials path and checks ln accepts the connection and a byte
// crosses it, which proves ln is the listener behind path.
func roundTrip(t *testing.T, ln net.Listener, path string) {
	t.Helper()
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{42}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		b   byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer s.Close()
		s.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		_, err = io.ReadFull(s, b[:])
		done <- result{b[0], err}
	}()
	if r := <-done; r.err != nil || r.b != 42 {
		t.Fatalf("accept on the listener for %s: read %d, %v", path, r.b, r.err)
	}
}

// setUmask sets the process umask for the rest of the test. Tests that call
// it do not run in parallel: the umask is process-wide.
func setUmask(t *testing.T, mask int) {
	t.Helper()
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

// onlyEntries fails unless dir holds exactly the names want: nothing of
// Listen's private directory is left behind.
func onlyEntries(t *testing.T, dir string, want ...string) {
	t.Helper()
	var got []string
	for _, e := range mustReadDir(t, dir) {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s holds %q, want %q", dir, got, want)
	}
}

func TestListenMode(t *testing.T) {
	for _, umask := range []int{0, 0o022} {
		for _, mode := range []os.FileMode{0o600, 0o660, 0o666, 0o700} {
			t.Run(fmt.Sprintf("umask %03o mode %v", umask, mode), func(t *testing.T) {
				setUmask(t, umask)
				path := sockPath(t)
				ln := listen(t, path, mode)
				fi, err := os.Lstat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Type() != fs.ModeSocket {
					t.Errorf("%s is %v, want a socket", path, fi.Mode())
				}
				if got := fi.Mode().Perm(); got != mode {
					t.Errorf("mode %v, want %v", got, mode)
				}
				if got := ln.Addr(); got.Network() != "unix" || got.String() != path {
					t.Errorf("Addr() = %s %s, want unix %s", got.Network(), got, path)
				}
				onlyEntries(t, filepath.Dir(path), filepath.Base(path))
				roundTrip(t, ln, path)
			})
		}
	}
}

// TestListenNeverLooser watches the path through many Listen and Close
// cycles under umask 0, which would make a freshly bound socket 0777: the
// socket must never be seen there with any mode but the one asked for.
func TestListenNeverLooser(t *testing.T) {
	setUmask(t, 0)
	const mode = 0o600
	path := sockPath(t)
	stop := make(chan struct{})
	type seen struct {
		sockets int
		bad     []os.FileMode
	}
	done := make(chan seen, 1)
	go func() {
		var s seen
		for {
			select {
			case <-stop:
				done <- s
				return
			default:
			}
			fi, err := os.Lstat(path)
			if err != nil || fi.Mode().Type() != fs.ModeSocket {
				continue
			}
			s.sockets++
			if fi.Mode().Perm() != mode && len(s.bad) < 10 {
				s.bad = append(s.bad, fi.Mode())
			}
		}
	}()
	for i := range 200 {
		ln, err := unixsock.Listen(path, mode)
		if err != nil {
			close(stop)
			<-done
			t.Fatalf("cycle %d: %v", i, err)
		}
		ln.Close()
	}
	close(stop)
	s := <-done
	if len(s.bad) > 0 {
		t.Errorf("saw the socket with modes %v, want only %v", s.bad, os.FileMode(mode))
	}
	if s.sockets == 0 {
		t.Log("the poller never caught the socket at the path")
	}
	onlyEntries(t, filepath.Dir(path))
}

// TestListenDialAtOnce: a client that dials the moment Listen returns
// reaches the listener through the published name.
func TestListenDialAtOnce(t *testing.T) {
	path := sockPath(t)
	for i := range 50 {
		ln, err := unixsock.Listen(path, 0o600)
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		c, err := net.Dial("unix", path)
		if err != nil {
			ln.Close()
			t.Fatalf("cycle %d: dial: %v", i, err)
		}
		ln.SetDeadline(time.Now().Add(5 * time.Second))
		s, err := ln.Accept()
		if err != nil {
			c.Close()
			ln.Close()
			t.Fatalf("cycle %d: accept: %v", i, err)
		}
		cred, err := unixsock.PeerCred(s)
		if err != nil || cred.PID != os.Getpid() {
			t.Errorf("cycle %d: PeerCred = %+v, %v", i, cred, err)
		}
		s.Close()
		c.Close()
		ln.Close()
	}
	onlyEntries(t, filepath.Dir(path))
}

// TestListenLongPath: a path as long as a socket path may be still binds,
// though the private name beside it is longer.
func TestListenLongPath(t *testing.T) {
	dir := t.TempDir()
	n := 107 - len(dir) - 1
	if n < 1 {
		t.Skipf("temp dir %s leaves no room", dir)
	}
	path := filepath.Join(dir, strings.Repeat("s", n))
	ln := listen(t, path, 0o660)
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket at %s: %v, %v", path, fi, err)
	}
	onlyEntries(t, dir, filepath.Base(path))
	roundTrip(t, ln, path)
	ln.Close()
	onlyEntries(t, dir)
}

func TestListenCreatesParent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "sm", "sm.sock")
	ln := listen(t, path, 0o600)
	fi, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm()&^0o750 != 0 {
		t.Errorf("parent is %v, want a directory no wider than 0750", fi.Mode())
	}
	roundTrip(t, ln, path)
}

func TestListenClosedUnlinks(t *testing.T) {
	path := sockPath(t)
	ln, err := unixsock.Listen(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket file after Close: %v, want it removed", err)
	}
	onlyEntries(t, filepath.Dir(path))
	if err := ln.Close(); err == nil {
		t.Error("second Close succeeded, want an error")
	}
}

// TestListenCloseSparesSuccessor: a socket that took over the path (ours was
// removed behind our back) is not ours to remove on Close.
func TestListenCloseSparesSuccessor(t *testing.T) {
	path := sockPath(t)
	ln, err := unixsock.Listen(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	next, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	before, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}

	ln.Close()
	after, err := os.Lstat(path)
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("successor's socket after our Close: %v, %v; want it untouched", after, err)
	}
	roundTrip(t, next, path)
}

// TestListenFailureLeavesNothing: a Listen that fails leaves no private
// directory or name behind, and what was at the path as it was.
func TestListenFailureLeavesNothing(t *testing.T) {
	t.Run("parent is a file", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "run"), "")
		ln, err := unixsock.Listen(filepath.Join(dir, "run", "sm.sock"), 0o600)
		if err == nil {
			ln.Close()
			t.Fatal("Listen under a file succeeded")
		}
		onlyEntries(t, dir, "run")
	})
	t.Run("live socket", func(t *testing.T) {
		path := sockPath(t)
		live, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer live.Close()
		ln, err := unixsock.Listen(path, 0o600)
		if !errors.Is(err, unixsock.ErrInUse) {
			if ln != nil {
				ln.Close()
			}
			t.Fatalf("Listen over a live socket = %v, want ErrInUse", err)
		}
		onlyEntries(t, filepath.Dir(path), filepath.Base(path))
	})
}

// TestListenRace: of several Listens racing for one path, one wins; the
// others fail with ErrInUse, whether they found the winner's socket when
// they probed or only when they linked theirs, and leave nothing behind.
func TestListenRace(t *testing.T) {
	const racers = 8
	var linkLost int
	for round := range 30 {
		path := sockPath(t)
		var wg sync.WaitGroup
		lns := make([]*unixsock.Listener, racers)
		errs := make([]error, racers)
		start := make(chan struct{})
		for i := range racers {
			wg.Go(func() {
				<-start
				lns[i], errs[i] = unixsock.Listen(path, 0o600)
			})
		}
		close(start)
		wg.Wait()
		var winner *unixsock.Listener
		for i, err := range errs {
			switch {
			case err == nil && winner == nil:
				winner = lns[i]
			case err == nil:
				lns[i].Close()
				t.Errorf("round %d: two Listens won", round)
			case !errors.Is(err, unixsock.ErrInUse):
				t.Errorf("round %d: loser's error %v, want ErrInUse", round, err)
			case errors.Is(err, fs.ErrExist):
				linkLost++
			}
		}
		if winner == nil {
			t.Fatalf("round %d: no Listen won: %v", round, errs)
		}
		onlyEntries(t, filepath.Dir(path), filepath.Base(path))
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Errorf("round %d: dial the winner: %v", round, err)
		} else {
			c.Close()
		}
		winner.Close()
		onlyEntries(t, filepath.Dir(path))
	}
	t.Logf("%d losers lost at the link, the rest at the probe", linkLost)
}

func TestListenReplacesStaleSocket(t *testing.T) {
	path := sockPath(t)
	// A listener that died without unlinking its socket, as a crashed one does.
	old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	old.SetUnlinkOnClose(false)
	old.Close()
	if _, err := net.Dial("unix", path); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial the stale socket: %v, want ECONNREFUSED", err)
	}

	ln := listen(t, path, 0o600)
	roundTrip(t, ln, path)
}

// listenInUse checks that Listen over path, a socket in use (what: "live",
// "busy"), fails with ErrInUse and leaves the file as it was.
func listenInUse(t *testing.T, path string, mode os.FileMode, what string) {
	t.Helper()
	before, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := unixsock.Listen(path, mode)
	if !errors.Is(err, unixsock.ErrInUse) {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("Listen over a %s socket = %v, want ErrInUse", what, err)
	}
	after, err := os.Lstat(path)
	if err != nil || !os.SameFile(before, after) || after.Mode() != before.Mode() {
		t.Errorf("%s socket file changed: %v, %v", what, after, err)
	}
}

func TestListenLiveSocketInUse(t *testing.T) {
	path := sockPath(t)
	live := listen(t, path, 0o600)
	listenInUse(t, path, 0o666, "live")
	// Listen's probe reached the live listener: it is there to accept, closed.
	live.SetDeadline(time.Now().Add(5 * time.Second))
	probe, err := live.Accept()
	if err != nil {
		t.Fatalf("accept the probe: %v", err)
	}
	if n, err := probe.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("probe connection read %d, %v; want EOF", n, err)
	}
	probe.Close()
	live.SetDeadline(time.Time{})
	roundTrip(t, live, path)
}

// TestListenFullBacklogInUse: a live listener whose accept queue is full
// answers a dial with EAGAIN, not ECONNREFUSED; it is in use, not stale.
func TestListenFullBacklogInUse(t *testing.T) {
	path := sockPath(t)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	// A backlog of 0 holds one pending connection.
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	pending, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer pending.Close()
	if c, err := net.Dial("unix", path); !errors.Is(err, syscall.EAGAIN) {
		if c != nil {
			c.Close()
		}
		t.Skipf("second dial to a full backlog: %v, want EAGAIN (kernel differs)", err)
	}
	listenInUse(t, path, 0o600, "busy")
	// Still the same listener: the pending connection is there to accept.
	nfd, _, err := syscall.Accept(fd)
	if err != nil {
		t.Fatalf("accept the pending connection: %v", err)
	}
	syscall.Close(nfd)
}

// TestListenNotASocket: a path taken by something that is not a socket is not
// a stale socket; Listen refuses it and leaves it as it was.
func TestListenNotASocket(t *testing.T) {
	tests := []struct {
		name  string
		make  func(t *testing.T, path string)
		check func(t *testing.T, path string)
	}{
		{"regular file",
			func(t *testing.T, path string) { writeFile(t, path, "precious") },
			func(t *testing.T, path string) { wantContent(t, path, "precious") }},
		{"empty file",
			func(t *testing.T, path string) { writeFile(t, path, "") },
			func(t *testing.T, path string) { wantContent(t, path, "") }},
		{"empty directory",
			func(t *testing.T, path string) {
				if err := os.Mkdir(path, 0o700); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, path string) {
				if fi, err := os.Lstat(path); err != nil || !fi.IsDir() {
					t.Errorf("directory at %s: %v, %v", path, fi, err)
				}
			}},
		{"symlink to a file",
			func(t *testing.T, path string) {
				writeFile(t, path+".target", "precious")
				if err := os.Symlink(path+".target", path); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, path string) {
				if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSymlink {
					t.Errorf("symlink at %s: %v, %v", path, fi, err)
				}
				wantContent(t, path+".target", "precious")
			}},
		{"dangling symlink",
			func(t *testing.T, path string) {
				if err := os.Symlink(path+".nowhere", path); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, path string) {
				if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSymlink {
					t.Errorf("symlink at %s: %v, %v", path, fi, err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := sockPath(t)
			tt.make(t, path)
			ln, err := unixsock.Listen(path, 0o600)
			if err == nil {
				ln.Close()
				t.Fatal("Listen succeeded over something that is not a socket")
			}
			if !errors.Is(err, fs.ErrExist) || errors.Is(err, unixsock.ErrInUse) {
				t.Errorf("err = %v, want fs.ErrExist", err)
			}
			tt.check(t, path)
			for _, e := range mustReadDir(t, filepath.Dir(path)) {
				if !strings.HasPrefix(e.Name(), filepath.Base(path)) {
					t.Errorf("left behind: %s", e.Name())
				}
			}
		})
	}
}

func mustReadDir(t *testing.T, dir string) []os.DirEntry {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ents
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func wantContent(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || string(b) != want {
		t.Errorf("%s holds %q, %v; want %q untouched", path, b, err, want)
	}
}

func TestPeerCred(t *testing.T) {
	path := sockPath(t)
	ln := listen(t, path, 0o600)
	client, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	want := unixsock.Cred{PID: os.Getpid(), UID: os.Getuid(), GID: os.Getgid()}
	for name, c := range map[string]net.Conn{"server side": server, "client side": client} {
		got, err := unixsock.PeerCred(c)
		if err != nil || got != want {
			t.Errorf("%s: PeerCred = %+v, %v; want %+v", name, got, err, want)
		}
	}
}

// TestPeerCredOtherProcess: the credentials are the peer's, not our own.
func TestPeerCredOtherProcess(t *testing.T) {
	path := sockPath(t)
	ln := listen(t, path, 0o600)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// GORACE: a race-enabled binary otherwise sleeps a second before exiting.
	cmd.Env = append(os.Environ(), helperDialEnv+"="+path, "GORACE=atexit_sleep_ms=0")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()

	ln.SetDeadline(time.Now().Add(10 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	got, err := unixsock.PeerCred(c)
	c.Close() // the helper exits
	want := unixsock.Cred{PID: cmd.Process.Pid, UID: os.Getuid(), GID: os.Getgid()}
	if err != nil || got != want {
		t.Errorf("PeerCred = %+v, %v; want %+v", got, err, want)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("helper: %v", err)
	}
}

func TestPeerCredErrors(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got, err := unixsock.PeerCred(a); err == nil {
		t.Errorf("PeerCred(net.Pipe) = %+v, want an error", got)
	}

	path := sockPath(t)
	listen(t, path, 0o600)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got, err := unixsock.PeerCred(c); err == nil {
		t.Errorf("PeerCred(closed conn) = %+v, want an error", got)
	}
}

func TestProcessGroup(t *testing.T) {
	if got, err := unixsock.ProcessGroup(os.Getpid()); err != nil || got != syscall.Getpgrp() {
		t.Errorf("ProcessGroup(self) = %d, %v; want %d", got, err, syscall.Getpgrp())
	}

	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if got, err := unixsock.ProcessGroup(cmd.Process.Pid); err != nil || got != cmd.Process.Pid {
		t.Errorf("ProcessGroup(group leader) = %d, %v; want %d", got, err, cmd.Process.Pid)
	}

	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	max, err := strconv.Atoi(string(b[:len(b)-1]))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := unixsock.ProcessGroup(max + 1); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("ProcessGroup(no such pid) = %d, %v; want ESRCH", got, err)
	}
}
