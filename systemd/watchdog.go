package systemd

import (
	"context"
	"errors"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Watchdog sends WATCHDOG=1 every half watchdog timeout until ctx is done,
// each time only once alive has returned nil. alive must prove that the work
// the watchdog stands for is being done (sm-manager's probe is a Status taken
// by the event loop); it is given until the watchdog would expire, so a probe
// stuck that long means no ping, and the service manager kills the process.
// Without a watchdog Watchdog returns at once.
func (n *Notifier) Watchdog(ctx context.Context, alive func(context.Context) error) {
	timeout := n.WatchdogTimeout()
	if timeout <= 0 {
		return
	}
	period := timeout / 2
	retry := max(period/8, time.Millisecond)
	// The service manager's timer runs from our start; count from now.
	deadline := time.Now().Add(timeout)
	wait := time.NewTimer(0)
	defer wait.Stop()
	failing := false // logged once per run of failed probes
	for {
		select {
		case <-ctx.Done():
			return
		case <-wait.C:
		}
		// Past the deadline systemd has either killed us or stopped watching
		// (as it does once STOPPING=1 is sent): keep probing, a period at a time.
		probeBy := deadline
		if floor := time.Now().Add(period); probeBy.Before(floor) {
			probeBy = floor
		}
		pctx, cancel := context.WithDeadline(ctx, probeBy)
		err := alive(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// context.Canceled: the manager has stopped, and Report is ending.
			if !failing && !errors.Is(err, context.Canceled) {
				n.log.Warn("watchdog: the manager's loop did not answer; not pinging", "err", err)
			}
			failing = true
			wait.Reset(retry)
			continue
		}
		if failing {
			n.log.Info("watchdog: the manager's loop answers again")
			failing = false
		}
		if err := n.send(daemon.SdNotifyWatchdog); err != nil {
			n.log.Warn("watchdog ping failed", "err", err)
		}
		deadline = time.Now().Add(timeout)
		wait.Reset(period)
	}
}
