package harness

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestWatchOrphan: the watch ends the context with errOrphaned only after
// the connection was gone for the whole timeout, counting from its loss, and
// a reconnection within the timeout starts the count again.
func TestWatchOrphan(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	const timeout = 200 * time.Millisecond
	done := make(chan struct{})
	go func() { defer close(done); watchOrphan(ctx, cancel, up.Load, timeout, time.Now) }()

	time.Sleep(3 * timeout) // connected: no orphan however long
	if ctx.Err() != nil {
		t.Fatal("orphaned while connected")
	}
	up.Store(false)
	time.Sleep(timeout / 2)
	up.Store(true) // back within the timeout
	time.Sleep(timeout)
	if ctx.Err() != nil {
		t.Fatal("orphaned by a loss shorter than the timeout")
	}
	lost := time.Now()
	up.Store(false)
	<-done
	if !orphaned(ctx) {
		t.Fatalf("context ended by %v, want errOrphaned", context.Cause(ctx))
	}
	if took := time.Since(lost); took < timeout {
		t.Fatalf("orphaned %v after the loss, before the timeout %v", took, timeout)
	}
	if e := orphanError(timeout); e.Code != 75 {
		t.Fatalf("orphan exit code %d", e.Code)
	}
}

// TestParseEnvOrphanTimeout: SM_ORPHAN_TIMEOUT_MS is optional, and must be a
// positive number of milliseconds when set.
func TestParseEnvOrphanTimeout(t *testing.T) {
	env := goodEnv()
	if e, err := ParseEnv(mapEnv(env)); err != nil || e.OrphanTimeout != 0 {
		t.Fatalf("unset: %+v %v", e, err)
	}
	env[EnvOrphanTimeout] = "1250"
	if e, err := ParseEnv(mapEnv(env)); err != nil || e.OrphanTimeout != 1250*time.Millisecond {
		t.Fatalf("1250: %+v %v", e, err)
	}
	for _, bad := range []string{"0", "-5", "1.5s", "x"} {
		env[EnvOrphanTimeout] = bad
		if _, err := ParseEnv(mapEnv(env)); err == nil {
			t.Fatalf("SM_ORPHAN_TIMEOUT_MS=%q accepted", bad)
		}
	}
}
