// Command sm-bench runs sm's load scenarios against real sm-manager and
// cluster-harness processes and reports what they measure; see package bench.
//
//	go build -o bin/ ./cmd/... && bin/sm-bench route
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sm-supervisor/sm/internal/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sm-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return bench.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
}
