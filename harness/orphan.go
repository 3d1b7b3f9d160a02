package harness

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// OrphanExitCode is the harness's exit status when it could not reach the
// manager's socket for Env.OrphanTimeout (EX_TEMPFAIL): its manager is gone,
// and in a mesh its lease will soon be another host's, so it must stop
// dispatching before that host starts the cluster (docs/multihost.md).
const OrphanExitCode = 75

// errOrphaned is the cause of Run's context ending for an orphan.
var errOrphaned = errors.New("the manager's socket could not be reached")

// orphanError is Run's result for an orphan.
func orphanError(timeout time.Duration) *ExitError {
	return &ExitError{Code: OrphanExitCode, Reason: fmt.Sprintf("orphaned: the manager's socket could not be reached for %v (%s)", timeout, EnvOrphanTimeout)}
}

// watchOrphan ends ctx (cancel, with errOrphaned) once c has been without a
// connection to the manager for timeout. It polls every timeout/8 and counts
// from the first poll that found the connection gone (or from the start), so
// it ends ctx at least timeout and at most timeout × 5/4 after the loss. It
// returns when ctx ends.
func watchOrphan(ctx context.Context, cancel context.CancelCauseFunc, connected func() bool, timeout time.Duration, now func() time.Time) {
	every := max(timeout/8, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	lost := now() // not connected yet: the count starts at once
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		switch {
		case connected():
			lost = time.Time{}
		case lost.IsZero():
			lost = now()
		case now().Sub(lost) >= timeout:
			cancel(errOrphaned)
			return
		}
	}
}

// orphaned reports whether ctx ended because the manager was unreachable.
func orphaned(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errOrphaned) }
