package systemd

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// DefaultStatusEvery is how often Report refreshes STATUS= by default.
const DefaultStatusEvery = time.Second

// Notifier sends sd_notify messages to the service manager that started the
// process. The zero value, and one made without a NOTIFY_SOCKET, is a no-op.
type Notifier struct {
	// StatusEvery is how often Report polls the manager to refresh STATUS=
	// (DefaultStatusEvery when zero).
	StatusEvery time.Duration

	socket   string        // NOTIFY_SOCKET; "" disables every message
	watchdog time.Duration // WATCHDOG_USEC; 0 disables the watchdog
	log      *slog.Logger

	mu       sync.Mutex
	status   string // the last STATUS= sent
	ready    bool
	stopping bool
}

// FromEnvironment returns a Notifier for the service manager named by
// NOTIFY_SOCKET, with the watchdog interval of WATCHDOG_USEC (when
// WATCHDOG_PID, if set, is this process). It unsets NOTIFY_SOCKET,
// WATCHDOG_USEC and WATCHDOG_PID: cluster processes inherit the manager's
// environment, and a bot that saw them would take itself for the service.
// daemon.SdNotify re-reads NOTIFY_SOCKET on every call, which is why the
// Notifier keeps the address itself.
func FromEnvironment(log *slog.Logger) *Notifier {
	socket := os.Getenv("NOTIFY_SOCKET")
	os.Unsetenv("NOTIFY_SOCKET")
	wd, err := daemon.SdWatchdogEnabled(true)
	if err != nil {
		if log != nil {
			log.Warn("systemd watchdog disabled", "err", err)
		}
		wd = 0
	}
	return NewNotifier(socket, wd, log)
}

// NewNotifier returns a Notifier that sends to the datagram socket at socket
// ("" disables it; a leading '@' names an abstract socket) and, when watchdog
// is positive, expects a WATCHDOG=1 at least that often.
func NewNotifier(socket string, watchdog time.Duration, log *slog.Logger) *Notifier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Notifier{socket: socket, watchdog: watchdog, log: log}
}

// Enabled reports whether a service manager listens to this Notifier.
func (n *Notifier) Enabled() bool { return n != nil && n.socket != "" }

// WatchdogTimeout is the service manager's watchdog timeout (WATCHDOG_USEC),
// or 0 when there is no watchdog.
func (n *Notifier) WatchdogTimeout() time.Duration {
	if !n.Enabled() {
		return 0
	}
	return n.watchdog
}

// Ready sends READY=1 with status as STATUS= (when not empty). Only the first
// call sends anything, and none after Stopping.
func (n *Notifier) Ready(status string) error {
	if !n.Enabled() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ready || n.stopping {
		return nil
	}
	n.ready = true
	msg := daemon.SdNotifyReady
	if status != "" {
		msg += "\nSTATUS=" + oneLine(status)
		n.status = status
	}
	return n.send(msg)
}

// Status sends STATUS=status, unless it is the one sent last.
func (n *Notifier) Status(status string) error {
	if !n.Enabled() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if status == n.status {
		return nil
	}
	n.status = status
	return n.send("STATUS=" + oneLine(status))
}

// Stopping sends STOPPING=1 once: the service has begun its shutdown. From
// then on Report sends StoppingLine as the status, and never READY=1.
func (n *Notifier) Stopping() error {
	if !n.Enabled() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopping {
		return nil
	}
	n.stopping = true
	n.status = "stopping: quiescing clusters"
	return n.send(daemon.SdNotifyStopping + "\nSTATUS=" + n.status)
}

// isStopping reports whether Stopping was called.
func (n *Notifier) isStopping() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stopping
}

// isReady reports whether READY=1 was sent.
func (n *Notifier) isReady() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ready
}

// send writes one datagram to the notify socket. Callers hold n.mu (or, for
// WATCHDOG=1, need no ordering with the other messages).
func (n *Notifier) send(msg string) error {
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: n.socket, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(msg)); err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}

// oneLine keeps a status to one line: a newline would start a new assignment.
func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
