// Command sm-manager supervises a sharded bot's cluster processes and routes
// messages between them and its clients over one Unix socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/unixsock"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sm-manager:", err)
		os.Exit(1)
	}
}

func run() error {
	cfgPath := flag.String("config", "/etc/sm/sm.toml", "path of the TOML configuration")
	logJSON := flag.Bool("log-json", false, "log as JSON lines instead of text")
	check := flag.Bool("check", false, "validate the configuration and exit")
	// Hidden (no usage line): for profiling under load, see docs/performance.md.
	cpuProfile := flag.String("cpuprofile", "", "")
	flag.Usage = usage
	flag.Parse()
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}

	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return err
	}
	if cfg.State.Dir == "" {
		// systemd's StateDirectory=: where the state file goes by default.
		cfg.State.Dir = os.Getenv("STATE_DIRECTORY")
	}
	if *check {
		fmt.Println("configuration OK:", cfg.Path)
		return nil
	}
	log := newLogger(cfg.LogLevel, *logJSON)

	m, err := manager.New(manager.Options{Config: cfg, Logger: log})
	if err != nil {
		return err
	}
	ln, err := unixsock.Listen(cfg.Socket, os.FileMode(cfg.SocketMode))
	if err != nil {
		return err
	}
	defer os.Remove(cfg.Socket)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("sm-manager serving", "socket", cfg.Socket, "topology", cfg.Topology.Generation().String(), "pid", os.Getpid())
	return m.Run(ctx, ln)
}

// usage is flag's usage without the hidden flags (those with no usage text).
func usage() {
	out := flag.CommandLine.Output()
	fmt.Fprintf(out, "Usage of %s:\n", os.Args[0])
	shown := flag.NewFlagSet("", flag.ContinueOnError)
	shown.SetOutput(out)
	flag.VisitAll(func(f *flag.Flag) {
		if f.Usage != "" {
			shown.Var(f.Value, f.Name, f.Usage)
		}
	})
	shown.PrintDefaults()
}

// startCPUProfile writes a CPU profile to path until the returned stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func newLogger(level string, asJSON bool) *slog.Logger {
	var lv slog.Level
	lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if asJSON {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
