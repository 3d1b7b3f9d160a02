package netns_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/internal/netns"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLinkCutAndHeal: hosts reach each other over the bridge, not while one's
// link is down, and again once it is healed.
func TestLinkCutAndHeal(t *testing.T) {
	hs := netns.New(t, 2)
	a, b := hs[0], hs[1]
	ln, err := a.Listen("tcp", a.Addr+":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hi")
			c.Close()
		}
	}()
	reach := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		c, err := b.DialContext(ctx, "tcp", a.Addr+":7000")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = io.ReadAll(c)
		return err
	}
	// A fresh link can take a moment to carry traffic (carrier, ARP).
	reachSoon := func(what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := reach()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("b cannot reach a %s: %v", what, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	reachSoon("at all")
	// The addresses exist only inside the namespaces. (Nothing is sent
	// from the test's own namespace to check: its default route leads off
	// the machine.)
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, ad := range addrs {
		if n, ok := ad.(*net.IPNet); ok && n.IP.String() == a.Addr {
			t.Fatalf("%s is an address of the test's own namespace", a.Addr)
		}
	}
	a.Cut()
	if err := reach(); err == nil {
		t.Fatal("b reached a through a cut link")
	}
	a.Heal()
	reachSoon("after the heal")
}
