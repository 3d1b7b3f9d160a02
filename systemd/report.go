package systemd

import (
	"context"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/manager"
)

// StatusSource is what Report watches; *manager.Manager is one. Status must be
// answered by the manager's event loop, so that an answer proves it turns.
type StatusSource interface {
	Status(ctx context.Context) (manager.Status, error)
}

// startPoll is how often Report polls until READY=1: the manager answers its
// first Status within milliseconds, and systemctl start waits for it.
const startPoll = 20 * time.Millisecond

// Report keeps the service manager informed about src until ctx is done: it
// sends READY=1 from the first Status that is Started, refreshes STATUS= every
// StatusEvery, and runs the Watchdog with a Status through the event loop as
// its probe. It returns at once without systemd, and otherwise once ctx is
// done and its goroutines have ended. Cancel ctx only after the manager's Run
// has returned, so that STATUS= follows the shutdown to its end.
func (n *Notifier) Report(ctx context.Context, src StatusSource) {
	if !n.Enabled() {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		n.Watchdog(ctx, func(ctx context.Context) error {
			_, err := src.Status(ctx)
			return err
		})
	})
	defer wg.Wait()

	every := n.StatusEvery
	if every <= 0 {
		every = DefaultStatusEvery
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		st, err := src.Status(qctx)
		cancel()
		if err == nil {
			n.update(st)
		}
		if n.isReady() || n.isStopping() {
			t.Reset(every)
		} else {
			t.Reset(startPoll)
		}
	}
}

// update sends what st changes: READY=1 the first time it is Started, and the
// status line.
func (n *Notifier) update(st manager.Status) {
	var err error
	switch {
	case n.isStopping():
		err = n.Status(StoppingLine(st))
	case !n.isReady() && Started(st):
		err = n.Ready(StatusLine(st))
		if err == nil {
			n.log.Info("told systemd READY=1", "status", StatusLine(st))
		}
	default:
		err = n.Status(StatusLine(st))
	}
	if err != nil {
		n.log.Warn("sd_notify failed", "err", err)
	}
}

// Start runs Report in the background, and sends STOPPING=1 the moment
// stopping is done (sm-manager passes its SIGTERM/SIGINT context). The
// returned end stops Report and waits for it: call it once the manager's Run
// has returned.
func (n *Notifier) Start(stopping context.Context, src StatusSource) (end func()) {
	after := context.AfterFunc(stopping, func() {
		if err := n.Stopping(); err != nil {
			n.log.Warn("sd_notify failed", "err", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Report(ctx, src)
	}()
	return func() {
		after()
		cancel()
		<-done
	}
}
