// Package netns makes test hosts out of Linux network namespaces: each host
// is a namespace with one veth link to a bridge in a switch namespace, and an
// address in 198.18.0.0/24 (the range set aside for benchmarking networks,
// RFC 2544) that exists only inside the namespaces this package made. A test
// cuts a host off by setting its link down. Everything is removed when the
// test ends. It needs root and the ip command; without them tests skip.
package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Host is one namespace acting as a machine.
type Host struct {
	// Name is the namespace's name (ip netns exec Name ...).
	Name string
	// Addr is the host's address on the test network.
	Addr string
	// link is the host's end of its veth pair, inside its namespace.
	link string
	t    testing.TB
}

// New makes hosts hosts on one switched network, or skips the test, saying
// why, where namespaces cannot be made.
func New(t testing.TB, hosts int) []*Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("netns: network namespaces need root; skipping")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("netns: the ip command (iproute2) is missing; skipping")
	}
	if hosts < 1 || hosts > 200 {
		t.Fatalf("netns: %d hosts", hosts)
	}
	// Names unique to this test process, short enough for a link (15 bytes).
	tag := fmt.Sprintf("%d", os.Getpid()%1_000_000)
	sw := "smsw" + tag
	if out, err := exec.Command("ip", "netns", "add", sw).CombinedOutput(); err != nil {
		t.Skipf("netns: cannot make a network namespace here (%v: %s); skipping", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", sw).Run() })
	run(t, "ip", "-n", sw, "link", "add", "br0", "type", "bridge", "forward_delay", "0")
	run(t, "ip", "-n", sw, "link", "set", "br0", "up")
	var out []*Host
	for i := range hosts {
		h := &Host{Name: fmt.Sprintf("smh%s-%d", tag, i), Addr: fmt.Sprintf("198.18.0.%d", i+1),
			link: fmt.Sprintf("svh%s%d", tag, i), t: t}
		peer := fmt.Sprintf("svs%s%d", tag, i)
		run(t, "ip", "netns", "add", h.Name)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", h.Name).Run() })
		run(t, "ip", "link", "add", h.link, "netns", h.Name, "type", "veth", "peer", "name", peer, "netns", sw)
		run(t, "ip", "-n", sw, "link", "set", peer, "master", "br0", "up")
		run(t, "ip", "-n", h.Name, "addr", "add", h.Addr+"/24", "dev", h.link)
		run(t, "ip", "-n", h.Name, "link", "set", h.link, "up")
		run(t, "ip", "-n", h.Name, "link", "set", "lo", "up")
		out = append(out, h)
	}
	for _, h := range out {
		h.waitUp()
	}
	return out
}

// waitUp waits, up to 10 s, for the kernel to report the host's link up
// (carrier on both ends), which lags the command that set it up.
func (h *Host) waitUp() {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := exec.Command("ip", "-n", h.Name, "-o", "link", "show", "dev", h.link).Output()
		if strings.Contains(string(b), "state UP") {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("netns: link of %s not up after 10s: %s", h.Name, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Exec is the command prefix that runs a program inside the host.
func (h *Host) Exec() []string { return []string{"ip", "netns", "exec", h.Name} }

// Cut sets the host's link down: nothing reaches it or leaves it until Heal.
func (h *Host) Cut() { h.t.Helper(); run(h.t, "ip", "-n", h.Name, "link", "set", h.link, "down") }

// Heal sets the host's link up again, and waits until it is.
func (h *Host) Heal() {
	h.t.Helper()
	run(h.t, "ip", "-n", h.Name, "link", "set", h.link, "up")
	h.waitUp()
}

// inside runs fn on a thread that has entered the host's namespace. The
// thread stays locked and dies with the goroutine, so no other goroutine
// ever runs in the namespace; sockets made there stay in it.
func (h *Host) inside(fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the runtime ends the thread
		f, err := os.Open("/run/netns/" + h.Name)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Unshare(unix.CLONE_FS); err != nil { // setns needs an unshared fs context
			errc <- err
			return
		}
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", h.Name, err)
			return
		}
		fn()
		errc <- nil
	}()
	return <-errc
}

// DialContext connects from inside the host.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	var derr error
	if err := h.inside(func() { c, derr = (&net.Dialer{}).DialContext(ctx, network, addr) }); err != nil {
		return nil, err
	}
	return c, derr
}

// Dial connects from inside the host (nats.CustomDialer's method).
func (h *Host) Dial(network, addr string) (net.Conn, error) {
	return h.DialContext(context.Background(), network, addr)
}

// Listen listens inside the host.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	var lerr error
	if err := h.inside(func() { ln, lerr = net.Listen(network, addr) }); err != nil {
		return nil, err
	}
	return ln, lerr
}
