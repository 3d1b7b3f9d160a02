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
	"runtime/pprof"
	"syscall"

	"github.com/sm-supervisor/sm/harness"
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
		stop, err := startCPUProfile(filepath.Join(dir, fmt.Sprintf("cluster-harness.%d.prof", os.Getpid())))
		if err != nil {
			return err
		}
		defer stop()
	}
	return harness.Run(context.Background(), cfg)
}

// startCPUProfile writes a CPU profile to path until the returned stop is
// called. SM_HARNESS_CPUPROFILE_DIR turns it on, one file per process, for
// profiling a whole fleet under sm-bench (docs/harness.md).
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
