// Command smclient is the systemd tests' client of sm-manager's socket: it
// checks that business ops are routed to every cluster, or keeps a steady load
// while a test kills the manager, and reports what happened.
//
//	smclient -socket /run/sm/sm.sock -clusters 4 -rounds 5   # exit 0: all routed
//	smclient -socket /run/sm/sm.sock -clusters 4 -for 10s    # JSON summary of a load
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "smclient:", err)
		os.Exit(1)
	}
}

func run() error {
	socket := flag.String("socket", "/run/sm/sm.sock", "manager socket")
	clusters := flag.Int("clusters", 1, "clusters to send to (targets 0..n-1)")
	rounds := flag.Int("rounds", 3, "echo rounds over every cluster, each of which must succeed")
	wait := flag.Duration("wait", 15*time.Second, "how long to wait for the manager and every cluster to answer first")
	load := flag.Duration("for", 0, "keep a sequential load this long instead, and print a JSON summary")
	flag.Parse()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := ipc.NewClient(ipc.ClientConfig{
		Path:      *socket,
		Register:  ipc.Frame{Role: ipc.RoleClient, Name: "smclient"},
		Reconnect: true,
	})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	wctx, wcancel := context.WithTimeout(ctx, *wait)
	defer wcancel()
	if err := c.WaitConnected(wctx); err != nil {
		return fmt.Errorf("connect %s: %w", *socket, err)
	}
	if *load > 0 {
		return runLoad(c, *clusters, *load)
	}
	for cl := range *clusters {
		var err error
		for {
			if err = echo(c, cl, -1); err == nil || wctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("cluster %d never answered: %w", cl, err)
		}
	}
	n := 0
	for r := range *rounds {
		for cl := range *clusters {
			if err := echo(c, cl, r); err != nil {
				return fmt.Errorf("round %d: %w", r, err)
			}
			n++
		}
	}
	fmt.Println("ok", n)
	return nil
}

// echo sends one echo to cluster cl and checks the payload came back.
func echo(c *ipc.Client, cl, round int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	want := fmt.Sprintf(`{"cluster":%d,"round":%d}`, cl, round)
	reply, err := c.Request(ctx, &ipc.Frame{Op: "echo", Target: strconv.Itoa(cl), Payload: json.RawMessage(want)})
	if err != nil {
		return fmt.Errorf("echo to cluster %d: %w", cl, err)
	}
	if string(reply.Payload) != want {
		return fmt.Errorf("echo to cluster %d: got %s, want %s", cl, reply.Payload, want)
	}
	return nil
}

// summary is what a load run prints.
type summary struct {
	Sent   int            `json:"sent"`
	OK     int            `json:"ok"`
	Failed int            `json:"failed"`
	Errors map[string]int `json:"errors"`
	// MaxStallMS is the longest time between two successful replies.
	MaxStallMS int64 `json:"max_stall_ms"`
	// SlowestMS is the longest a single request took, failed or not: a
	// request that hangs shows here.
	SlowestMS int64 `json:"slowest_ms"`
}

func runLoad(c *ipc.Client, clusters int, d time.Duration) error {
	s := summary{Errors: map[string]int{}}
	end := time.Now().Add(d)
	last := time.Now()
	for i := 0; time.Now().Before(end); i++ {
		start := time.Now()
		err := echo(c, i%clusters, i)
		s.Sent++
		s.SlowestMS = max(s.SlowestMS, time.Since(start).Milliseconds())
		if err == nil {
			s.OK++
			s.MaxStallMS = max(s.MaxStallMS, time.Since(last).Milliseconds())
			last = time.Now()
			continue
		}
		s.Failed++
		code := "other"
		var ie *ipc.Error
		switch {
		case errors.As(err, &ie):
			code = ie.Code
		case errors.Is(err, ipc.ErrUnavailable):
			code = "disconnected"
		case errors.Is(err, ipc.ErrTimeout):
			code = "timeout"
		}
		s.Errors[code]++
		if errors.Is(err, ipc.ErrUnavailable) {
			time.Sleep(10 * time.Millisecond) // reconnecting: do not spin
		}
	}
	return json.NewEncoder(os.Stdout).Encode(s)
}
