// Command cluster-harness is a cluster process for sm-manager: a simulated
// sharded bot (--simulate, the default) or a bridge that runs any program
// speaking the wire protocol as JSON lines on stdin/stdout (--exec -- CMD...).
// See docs/harness.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/sm-supervisor/sm/harness"
	"github.com/sm-supervisor/sm/internal/cpuprofile"
)

func main() {
	err := run()
	var exit *harness.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		os.Exit(exit.Code) // the harness has logged why
	default:
		fmt.Fprintln(os.Stderr, "cluster-harness:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := harness.ParseArgs("cluster-harness", os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	cfg.Logger = harness.NewLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel, cfg.Env)
	cfg.Stderr = os.Stderr
	// Caught, never default: the harness decides what a signal means (drain,
	// forward to the child, or nothing with --ignore-quiesce).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	cfg.Signals = sigs
	if dir := os.Getenv("SM_HARNESS_CPUPROFILE_DIR"); dir != "" {
		stop, err := cpuprofile.Start(filepath.Join(dir, fmt.Sprintf("cluster-harness.%d.prof", os.Getpid())))
		if err != nil {
			return err
		}
		defer stop()
	}
	return harness.Run(context.Background(), cfg)
}
