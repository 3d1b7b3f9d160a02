// Package unixsock creates the manager's Unix socket safely and tells who is on
// the other end of a connection.
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ErrInUse means another process is serving on the socket path.
var ErrInUse = errors.New("socket is in use by a live process")

// Listen creates a Unix stream socket at path with the given mode. A socket left
// at path is removed only if a dial to it is refused: a live manager's socket
// is never stolen. Anything else at path (a file, a directory, a symlink) is
// not a stale socket and is left alone: an error wrapping fs.ErrExist. The
// parent directory is created (0750) if missing, and the mode is set before the
// listener is returned, so no connection is accepted under a looser one.
func Listen(path string, mode os.FileMode) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen %s: chmod: %w", path, err)
	}
	return ln, nil
}

// removeStale removes the socket at path if nothing serves it. Only a refused
// dial proves that: a listener with a full backlog answers EAGAIN, and any
// other failure is no proof either.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("not a socket (mode %v): %w", fi.Mode(), fs.ErrExist)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	switch {
	case err == nil:
		c.Close()
		return ErrInUse
	case errors.Is(err, syscall.EAGAIN):
		return ErrInUse
	case errors.Is(err, syscall.ENOENT):
		return nil // removed since the Lstat
	case !errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("probe existing socket: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

// Cred is the peer of a Unix connection as the kernel saw it at connect time.
type Cred struct {
	PID int
	UID int
	GID int
}

// PeerCred returns the SO_PEERCRED credentials of c.
func PeerCred(c net.Conn) (Cred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Cred{}, fmt.Errorf("peer credentials: %T is not a Unix connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var ucred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		ucred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", serr)
	}
	return Cred{PID: int(ucred.Pid), UID: int(ucred.Uid), GID: int(ucred.Gid)}, nil
}

// ProcessGroup returns the process group of pid, or an error if it is gone.
func ProcessGroup(pid int) (int, error) {
	pgid, err := syscall.Getpgid(pid)
	if err != nil {
		return 0, fmt.Errorf("process group of %d: %w", pid, err)
	}
	return pgid, nil
}
