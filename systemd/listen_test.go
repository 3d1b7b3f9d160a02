package systemd

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sm-supervisor/sm/config"
)

// passed is a socket as systemd would pass it: a dup of a listener's fd,
// under an fd name. The original listener is closed by the test's cleanup.
func passed(t *testing.T, ln net.Listener, name string) *os.File {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	sc, ok := ln.(syscall.Conn)
	if !ok {
		t.Fatalf("%T has no fd", ln)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var nfd int
	var derr error
	raw.Control(func(fd uintptr) { nfd, derr = syscall.Dup(int(fd)) })
	if derr != nil {
		t.Fatal(derr)
	}
	return os.NewFile(uintptr(nfd), name)
}

func unixListener(t *testing.T, path string) net.Listener {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func tcpListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func listenConfig(t *testing.T) *config.Config {
	dir, err := os.MkdirTemp("", "smsd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := config.Default()
	cfg.Socket = filepath.Join(dir, "sm.sock")
	cfg.Status.Listen = "127.0.0.1:7480"
	return &cfg
}

var discard = slog.New(slog.DiscardHandler)

func TestFromFilesByName(t *testing.T) {
	cfg := listenConfig(t)
	tcp := tcpListener(t)
	files := []*os.File{
		passed(t, tcp, FDNameStatus), // order does not matter when named
		passed(t, unixListener(t, cfg.Socket), FDNameIPC),
	}
	ipc, status, err := fromFiles(files, cfg, discard)
	if err != nil {
		t.Fatal(err)
	}
	defer ipc.Close()
	defer status.Close()
	if ipc.Addr().String() != cfg.Socket {
		t.Errorf("ipc on %s, want %s", ipc.Addr(), cfg.Socket)
	}
	if status.Addr().String() != tcp.Addr().String() {
		t.Errorf("status on %s, want %s", status.Addr(), tcp.Addr())
	}
	checkServes(t, ipc)
}

func TestFromFilesByKind(t *testing.T) {
	for _, names := range [][2]string{
		{"LISTEN_FD_3", "LISTEN_FD_4"},            // no LISTEN_FDNAMES
		{"sm-manager.socket", "sm-status.socket"}, // systemd's default: the socket unit's name
	} {
		t.Run(names[0], func(t *testing.T) {
			cfg := listenConfig(t)
			files := []*os.File{passed(t, unixListener(t, cfg.Socket), names[0]), passed(t, tcpListener(t), names[1])}
			ipc, status, err := fromFiles(files, cfg, discard)
			if err != nil {
				t.Fatal(err)
			}
			defer ipc.Close()
			defer status.Close()
			if ipc.Addr().Network() != "unix" || status.Addr().Network() != "tcp" {
				t.Fatalf("ipc %s, status %s", ipc.Addr().Network(), status.Addr().Network())
			}
		})
	}
}

func TestFromFilesRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files func(t *testing.T, cfg *config.Config) []*os.File
		want  string
	}{
		{"IPC socket at another path", func(t *testing.T, cfg *config.Config) []*os.File {
			return []*os.File{passed(t, unixListener(t, cfg.Socket+".other"), FDNameIPC)}
		}, "but the config's socket is"},
		{"two IPC sockets", func(t *testing.T, cfg *config.Config) []*os.File {
			return []*os.File{
				passed(t, unixListener(t, cfg.Socket), FDNameIPC),
				passed(t, unixListener(t, cfg.Socket+".2"), "LISTEN_FD_4"),
			}
		}, "more than one fd for sm-manager.sock"},
		{"not a listener", func(t *testing.T, cfg *config.Config) []*os.File {
			f, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			return []*os.File{passed(t, unixListener(t, cfg.Socket), FDNameIPC), f}
		}, "is not a listening stream socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := listenConfig(t)
			files := tc.files(t, cfg)
			ipc, status, err := fromFiles(files, cfg, discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if ipc != nil || status != nil {
				t.Fatal("listeners returned with an error")
			}
			for _, f := range files {
				if _, err := f.Stat(); err == nil {
					t.Errorf("fd %q left open", f.Name())
				}
			}
		})
	}
}

func TestFromFilesStatusDisabled(t *testing.T) {
	cfg := listenConfig(t)
	cfg.Status.Listen = ""
	ipc, status, err := fromFiles([]*os.File{passed(t, tcpListener(t), FDNameStatus)}, cfg, discard)
	if err != nil || ipc != nil || status != nil {
		t.Fatalf("got %v, %v, %v; want nothing: status.listen is empty", ipc, status, err)
	}
}

// A passed Unix socket's path is systemd's: closing the listener keeps it.
func TestPassedSocketPathOutlivesClose(t *testing.T) {
	cfg := listenConfig(t)
	ipc, _, err := fromFiles([]*os.File{passed(t, unixListener(t, cfg.Socket), FDNameIPC)}, cfg, discard)
	if err != nil {
		t.Fatal(err)
	}
	ipc.Close()
	if _, err := os.Stat(cfg.Socket); err != nil {
		t.Fatalf("socket path gone after Close: %v", err)
	}
}

func TestListenersWithoutActivation(t *testing.T) {
	cfg := listenConfig(t)
	cfg.SocketMode = 0o660
	cfg.Status.Listen = "127.0.0.1:0"
	ipc, status, err := Listeners(cfg, discard)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a socket with 0660", fi.Mode())
	}
	checkServes(t, ipc)
	checkServes(t, status)
	ipc.Close()
	status.Close()

	cfg.Status.Listen = ""
	ipc, status, err = Listeners(cfg, discard)
	if err != nil {
		t.Fatal(err)
	}
	ipc.Close()
	if status != nil {
		t.Fatal("a status listener with status.listen empty")
	}
}

// checkServes accepts one connection on ln and reads what the client wrote.
func checkServes(t *testing.T, ln net.Listener) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		b, err := io.ReadAll(c)
		if err == nil && string(b) != "hi" {
			err = io.ErrUnexpectedEOF
		}
		done <- err
	}()
	c, err := net.Dial(ln.Addr().Network(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("hi"))
	c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
