// Package unixsock creates the manager's Unix socket safely and tells who is on
// the other end of a connection.
//
// Listen binds the socket in a private directory beside its path, sets its
// mode there, and only then links it into place, so the socket is never
// reachable at its path under a mode other than the one asked for. The umask
// is left alone: it is process-wide, and other goroutines create files too.
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// ErrInUse means another process is serving on the socket path.
var ErrInUse = errors.New("socket is in use by a live process")

// maxPath is the longest socket path a sockaddr_un holds, as config
// validation counts it.
const maxPath = 107

// sockName is the socket's name in its private directory.
const sockName = "s"

// Listener is a Unix listener made by Listen. It is the *net.UnixListener
// bound in the private directory, except that Addr reports the path the
// socket was published at, and Close removes that path if it still names
// this socket. Accepted connections' LocalAddr is the private name, which is
// gone by the time Listen returns.
type Listener struct {
	*net.UnixListener
	path     string
	dev, ino uint64
	unlink   sync.Once
}

// Listen creates a Unix stream socket at path with the given mode. A socket left
// at path is removed only if a dial to it is refused: a live manager's socket
// is never stolen. Anything else at path (a file, a directory, a symlink) is
// not a stale socket and is left alone: an error wrapping fs.ErrExist. The
// parent directory is created (0750) if missing.
//
// The socket is bound at a temporary name in a new 0700 directory beside
// path, given its mode there, and then hard-linked at path, so no client can
// reach it at path under a looser mode, whatever the umask. The link fails
// rather than replace what another process created at path meanwhile (a
// racing Listen's socket): an error wrapping ErrInUse and fs.ErrExist. The temporary name and directory
// are removed before Listen returns, on error too.
func Listen(path string, mode os.FileMode) (*Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	l, err := publish(path, mode)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return l, nil
}

// publish binds a socket with mode in a private directory next to path and
// links it at path. It removes the directory whatever happens.
func publish(path string, mode os.FileMode) (*Listener, error) {
	// Same directory, so same file system: a hard link needs it.
	tmp, err := os.MkdirTemp(filepath.Dir(path), "."+filepath.Base(path)+".")
	if err != nil {
		return nil, fmt.Errorf("private directory: %w", err)
	}
	ln, st, err := bindIn(tmp, mode)
	var l *Listener
	if err == nil {
		if err = os.Link(filepath.Join(tmp, sockName), path); err == nil {
			l = &Listener{UnixListener: ln, path: path, dev: uint64(st.Dev), ino: uint64(st.Ino)}
		} else if errors.Is(err, fs.ErrExist) {
			err = fmt.Errorf("%w: created at the path while this socket was bound (%w)", ErrInUse, err)
		}
	}
	if rerr := os.RemoveAll(tmp); rerr != nil && err == nil {
		err = fmt.Errorf("remove private directory: %w", rerr)
	}
	if err != nil {
		switch {
		case l != nil:
			l.Close()
		case ln != nil:
			ln.Close()
		}
		return nil, err
	}
	return l, nil
}

// bindIn binds a listening socket at sockName in dir and sets its mode. It
// returns the socket file's stat, which identifies it under any name.
func bindIn(dir string, mode os.FileMode) (*net.UnixListener, *syscall.Stat_t, error) {
	name := filepath.Join(dir, sockName)
	bindName := name
	if len(name) > maxPath {
		// The private directory made a path that fits sun_path too long for
		// it: bind through the directory's descriptor, as systemd does.
		d, err := os.Open(dir)
		if err != nil {
			return nil, nil, err
		}
		defer d.Close()
		bindName = fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), sockName)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: bindName, Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	// Listener.Close removes the published path; the private name is gone
	// by then, and another Listen's directory may reuse it.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(name, mode); err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("chmod: %w", err)
	}
	fi, err := os.Lstat(name)
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		ln.Close()
		return nil, nil, fmt.Errorf("stat %s: no inode (%T)", name, fi.Sys())
	}
	return ln, st, nil
}

// Addr returns the path the socket was published at.
func (l *Listener) Addr() net.Addr {
	return &net.UnixAddr{Name: l.path, Net: "unix"}
}

// Close removes the socket's path if it still names this socket, never a
// successor's, then stops listening. Only the first Close removes anything.
func (l *Listener) Close() error {
	// Checked while the socket is still open: until then it answers dials,
	// so no Listen removes it as stale or links another in its place, and
	// its inode cannot be reused.
	l.unlink.Do(func() {
		if l.owns() {
			os.Remove(l.path)
		}
	})
	return l.UnixListener.Close()
}

// owns reports whether l.path names l's socket file.
func (l *Listener) owns() bool {
	fi, err := os.Lstat(l.path)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == l.dev && uint64(st.Ino) == l.ino
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
