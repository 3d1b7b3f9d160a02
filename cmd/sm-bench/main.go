// Command sm-bench runs sm's load scenarios against real sm-manager and
// cluster-harness processes and reports what they measure; see package bench.
//
//	go build -o bin/ ./cmd/... && bin/sm-bench route
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sm-supervisor/sm/internal/bench"
	"github.com/sm-supervisor/sm/internal/cmdmain"
)

func main() { cmdmain.Main("sm-bench", run) }

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return bench.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
}
