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
	flag.Parse()

	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return err
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

func newLogger(level string, asJSON bool) *slog.Logger {
	var lv slog.Level
	lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if asJSON {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
