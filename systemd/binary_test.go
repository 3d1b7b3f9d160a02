package systemd_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
)

// writeConfig writes cfg as TOML into dir and returns the file's path.
func writeConfig(t *testing.T, dir string, cfg *config.Config) string {
	t.Helper()
	cfg.Path = filepath.Join(dir, "sm.toml")
	testenv.WriteConfig(t, cfg)
	return cfg.Path
}

// proc is a process a test started, with its output kept for the failure log.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
	err  error
}

func startProc(t *testing.T, env []string, argv ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(argv[0], argv[1:]...), out: &testenv.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(20 * time.Second):
				p.cmd.Process.Kill()
				<-p.done
				t.Errorf("%s did not stop on SIGTERM", argv[0])
			}
		}
		if t.Failed() {
			t.Logf("output of %s:\n%s", argv[0], p.out.String())
		}
	})
	return p
}

// stop sends SIGTERM and waits for the exit status.
func (p *proc) stop() error {
	p.t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(20 * time.Second):
		p.t.Fatal("no exit 20s after SIGTERM")
		return nil
	}
}

// children returns the pids of the cluster processes whose parent is pid.
func children(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink("/proc/" + e.Name() + "/exe"); err != nil || exe != testenv.Bin("cluster-harness") {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, c)
		}
	}
	return out
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(stat)
	return !strings.HasPrefix(s[strings.LastIndexByte(s, ')')+2:], "Z")
}

// TestBinaryUnderFakeServiceManager runs the sm-manager binary as systemd
// would (NOTIFY_SOCKET, WATCHDOG_USEC) and checks the whole exchange, and that
// no cluster inherits the service manager's variables.
func TestBinaryUnderFakeServiceManager(t *testing.T) {
	t.Parallel()
	sd := newFakeSD(t)
	dir := shortDir(t)
	cfg := testConfig(dir)
	env := append(os.Environ(), "NOTIFY_SOCKET="+sd.path, "WATCHDOG_USEC=1000000")
	p := startProc(t, env, testenv.Bin("sm-manager"), "-config", writeConfig(t, dir, cfg))

	i, _ := sd.waitMsg(0, 10*time.Second, "READY=1", func(m sdMsg) bool { return m.has("READY=1") })
	echoAll(t, cfg.Socket, 4)
	sd.waitMsg(i, 10*time.Second, "STATUS 4/4 ready", func(m sdMsg) bool {
		return m.has("STATUS=4/4 clusters ready, generation 1")
	})
	from := time.Now()
	time.Sleep(2600 * time.Millisecond)
	pings := sd.pings(from, time.Now())
	if len(pings) < 4 {
		t.Errorf("%d pings in 2.6s at a 500ms period", len(pings))
	}
	checkPingRate(t, from, pings, 500*time.Millisecond, time.Second)

	kids := children(p.cmd.Process.Pid)
	if len(kids) != 4 {
		t.Fatalf("%d cluster processes, want 4", len(kids))
	}
	for _, k := range kids {
		env, err := os.ReadFile("/proc/" + strconv.Itoa(k) + "/environ")
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"NOTIFY_SOCKET=", "WATCHDOG_USEC=", "WATCHDOG_PID=", "LISTEN_FDS="} {
			if bytes.Contains(env, []byte("\x00"+v)) || bytes.HasPrefix(env, []byte(v)) {
				t.Errorf("cluster %d inherited %s...", k, v)
			}
		}
	}

	stopAt := time.Now()
	if err := p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	_, m := sd.waitMsg(0, time.Second, "STOPPING=1", func(m sdMsg) bool { return m.has("STOPPING=1") })
	if m.at.Before(stopAt) {
		t.Error("STOPPING=1 before SIGTERM")
	}
	for _, k := range kids {
		if alive(k) {
			t.Errorf("cluster process %d outlived a clean stop", k)
		}
	}
	if _, err := os.Stat(cfg.Socket); err == nil {
		t.Error("the socket the manager made outlived it")
	}
}

func socketActivate(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("systemd-socket-activate not installed (Debian package systemd)")
	}
	return bin
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// waitListening waits until a connection to the Unix socket at path succeeds
// (systemd-socket-activate binds before it listens), and closes it: under
// systemd-socket-activate, that first connection starts the manager.
func waitListening(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s: %v", path, err)
		}
	}
}

// TestSocketActivation runs sm-manager under systemd-socket-activate, which
// binds the socket, waits for a first connection and then execs the manager
// with the socket as fd 3 (LISTEN_FDS): the manager must serve it as it is.
func TestSocketActivation(t *testing.T) {
	t.Parallel()
	sa := socketActivate(t)
	sd := newFakeSD(t)
	dir := shortDir(t)
	cfg := testConfig(dir)
	cfgPath := writeConfig(t, dir, cfg)
	p := startProc(t, os.Environ(), sa, "-l", cfg.Socket, "--fdname=sm-manager.sock",
		"-E", "NOTIFY_SOCKET="+sd.path, testenv.Bin("sm-manager"), "-config", cfgPath)
	waitListening(t, cfg.Socket)
	ino := inode(t, cfg.Socket)

	// The first connection started the manager; this one is answered on the
	// inherited socket. Had the manager made its own socket at that path,
	// it would have found this one live and refused to start.
	echoAll(t, cfg.Socket, 4)
	sd.waitMsg(0, 10*time.Second, "READY=1", func(m sdMsg) bool { return m.has("READY=1") })
	if !strings.Contains(p.out.String(), "serving the IPC socket systemd passed") {
		t.Errorf("the manager did not say it took the passed socket:\n%s", p.out.String())
	}
	if got := inode(t, cfg.Socket); got != ino {
		t.Errorf("socket replaced: inode %d, was %d", got, ino)
	}
	echoAll(t, cfg.Socket, 4) // a second client, accepted by the manager itself

	if err := p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	// The path is systemd's (RemoveOnStop= in the .socket unit), not the manager's.
	if got := inode(t, cfg.Socket); got != ino {
		t.Errorf("socket path changed or removed by the manager")
	}
}

// TestSocketActivationWrongPath: a passed socket other than the config's is
// refused, since clusters would be told a path nobody serves.
func TestSocketActivationWrongPath(t *testing.T) {
	t.Parallel()
	sa := socketActivate(t)
	dir := shortDir(t)
	cfg := testConfig(dir)
	other := filepath.Join(dir, "other.sock")
	p := startProc(t, os.Environ(), sa, "-l", other, "--fdname=sm-manager.sock", testenv.Bin("sm-manager"), "-config", writeConfig(t, dir, cfg))
	waitListening(t, other)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the manager did not refuse a socket at the wrong path")
	}
	if p.err == nil || !strings.Contains(p.out.String(), "but the config's socket is") {
		t.Fatalf("exit %v, output:\n%s", p.err, p.out.String())
	}
}
