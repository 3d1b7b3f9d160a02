package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/unixsock"
)

// Serve runs run in a goroutine until stop, which cancels run's context and
// fails the test unless run returns nil within timeout; what names it in the
// failure. Stop also runs when the test ends; a second stop returns at once.
func Serve(t testing.TB, what string, timeout time.Duration, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	stop = func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s Run: %v", what, err)
			}
			done <- nil
		case <-time.After(timeout):
			t.Fatalf("%s did not stop within %v", what, timeout)
		}
	}
	t.Cleanup(stop)
	return stop
}

// Manager is a manager.Manager serving its config's socket in-process.
type Manager struct {
	*manager.Manager
	t    testing.TB
	stop func()
}

// StartManager creates a manager from opts and serves opts.Config.Socket until
// Stop, which runs when the test ends.
func StartManager(t testing.TB, opts manager.Options) *Manager {
	t.Helper()
	mm, err := manager.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := unixsock.Listen(opts.Config.Socket, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	stop := Serve(t, "manager", 20*time.Second, func(ctx context.Context) error { return mm.Run(ctx, ln) })
	return &Manager{Manager: mm, t: t, stop: stop}
}

// Stop stops the manager (as SIGTERM does, its clusters with it) and fails the
// test unless Run returns nil within 20s. A second Stop returns at once.
func (m *Manager) Stop() { m.stop() }

// MustStatus is Status within 5s; an error fails the test.
func (m *Manager) MustStatus() manager.Status {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := m.Status(ctx)
	if err != nil {
		m.t.Fatalf("status: %v", err)
	}
	return st
}

// WaitReady waits up to 15s until the clusters ids (every cluster, if none)
// are ready and routed, and returns the status that showed it.
func (m *Manager) WaitReady(ids ...int) manager.Status {
	m.t.Helper()
	var st manager.Status
	WaitFor(m.t, 15*time.Second, "clusters ready", func() bool {
		st = m.MustStatus()
		if len(ids) == 0 {
			for _, c := range st.Clusters {
				if !ready(c) {
					return false
				}
			}
			return true
		}
		for _, id := range ids {
			if id >= len(st.Clusters) || !ready(st.Clusters[id]) {
				return false
			}
		}
		return true
	})
	return st
}

func ready(c manager.ClusterStatus) bool { return c.State == "ready" && c.Routed }

// Dial registers a client named name on the manager's socket, within 5s; it
// is closed when the test ends.
func Dial(t testing.TB, socket, name string) *ipc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{Path: socket, Register: ipc.Frame{Role: ipc.RoleClient, Name: name}})
	if err != nil {
		t.Fatalf("dial %s: %v", socket, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
