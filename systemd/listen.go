package systemd

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/coreos/go-systemd/v22/activation"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/unixsock"
)

// File descriptor names (FileDescriptorName= of the .socket units) of the
// sockets sm-manager takes by socket activation.
const (
	FDNameIPC    = "sm-manager.sock"
	FDNameStatus = "sm-status"
)

// Listeners returns the listener of the manager's IPC socket and, when
// cfg.Status.Listen is set, that of the status page (nil otherwise): the
// sockets systemd passed (Activated), else ones made here (ListenIPC,
// ListenStatus).
func Listeners(cfg *config.Config, log *slog.Logger) (ipc, status net.Listener, err error) {
	ipcFD, statusFD, err := Activated(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	ipc, err = ListenIPC(cfg, ipcFD)
	if err != nil {
		closeAll(statusFD)
		return nil, nil, err
	}
	status, err = ListenStatus(cfg, statusFD)
	if err != nil {
		closeAll(ipc)
		return nil, nil, err
	}
	return ipc, status, nil
}

// Activated returns the sockets systemd passed by socket activation
// (LISTEN_FDS): the IPC socket and the status listener, each nil when not
// passed. It unsets LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES, which cluster
// processes must not inherit, so only its first call finds anything.
//
// Sockets are matched by name first (FileDescriptorName=, FDNameIPC and
// FDNameStatus); one with any other name is taken by kind: a Unix socket as
// the IPC socket, a TCP one as the status listener. A passed IPC socket must
// be bound at cfg.Socket, since that path is what clusters are told to
// connect to. A status socket passed while cfg.Status.Listen is empty is
// closed: the config says whether the page is served. Closing a passed Unix
// listener leaves its path alone: it is systemd's.
func Activated(cfg *config.Config, log *slog.Logger) (ipc, status net.Listener, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return fromFiles(activation.Files(true), cfg, log)
}

// ListenIPC returns passed, the IPC socket systemd passed, or when it is nil
// creates the socket at cfg.Socket with cfg.SocketMode (unixsock.Listen).
func ListenIPC(cfg *config.Config, passed net.Listener) (net.Listener, error) {
	if passed != nil {
		return passed, nil
	}
	ln, err := unixsock.Listen(cfg.Socket, os.FileMode(cfg.SocketMode))
	if err != nil {
		return nil, err
	}
	return ln, nil
}

// ListenStatus returns passed, the status socket systemd passed, or when it
// is nil listens on cfg.Status.Listen; it returns nil, nil when that is empty.
func ListenStatus(cfg *config.Config, passed net.Listener) (net.Listener, error) {
	if passed != nil || cfg.Status.Listen == "" {
		return passed, nil
	}
	ln, err := net.Listen("tcp", cfg.Status.Listen)
	if err != nil {
		return nil, fmt.Errorf("status listener: %w", err)
	}
	return ln, nil
}

// fromFiles sorts the passed sockets into the IPC and status listeners; it
// closes every file, and on error every listener too.
func fromFiles(files []*os.File, cfg *config.Config, log *slog.Logger) (ipc, status net.Listener, err error) {
	var errs []error
	for _, f := range files {
		name := f.Name()
		ln, lerr := net.FileListener(f)
		f.Close()
		if lerr != nil {
			errs = append(errs, fmt.Errorf("socket activation: fd %q is not a listening stream socket: %w", name, lerr))
			continue
		}
		role := roleOf(name, ln)
		switch {
		case role == FDNameIPC && ipc == nil:
			ipc = ln
		case role == FDNameStatus && status == nil:
			status = ln
		case role == "":
			errs = append(errs, fmt.Errorf("socket activation: fd %q (%s %s) is neither the IPC socket nor the status listener", name, ln.Addr().Network(), ln.Addr()))
			ln.Close()
		default:
			errs = append(errs, fmt.Errorf("socket activation: more than one fd for %s (fd %q)", role, name))
			ln.Close()
		}
	}
	if ipc != nil {
		got, want := filepath.Clean(ipc.Addr().String()), filepath.Clean(cfg.Socket)
		if got != want {
			errs = append(errs, fmt.Errorf("socket activation: systemd passed the socket %s but the config's socket is %s (clusters are told the config's path): make them the same", got, want))
		} else {
			log.Info("serving the IPC socket systemd passed")
			log.Debug("the IPC socket systemd passed", "socket", got)
		}
	}
	if status != nil {
		if cfg.Status.Listen == "" {
			log.Warn("status.listen is empty: closing the status socket systemd passed", "addr", status.Addr().String())
			status.Close()
			status = nil
		} else {
			log.Info("serving the status listener systemd passed", "addr", status.Addr().String())
		}
	}
	if err := errors.Join(errs...); err != nil {
		closeAll(ipc, status)
		return nil, nil, err
	}
	return ipc, status, nil
}

// roleOf says which listener a passed socket is: FDNameIPC, FDNameStatus, or
// "" when neither its name nor its kind tells.
func roleOf(name string, ln net.Listener) string {
	switch name {
	case FDNameIPC, FDNameStatus:
		return name
	}
	switch ln.Addr().Network() {
	case "unix":
		return FDNameIPC
	case "tcp":
		return FDNameStatus
	}
	return ""
}

func closeAll(lns ...net.Listener) {
	for _, ln := range lns {
		if ln != nil {
			ln.Close()
		}
	}
}
