// Command sm-api is sm's HTTP API: status, guild lookups, deploys and
// forwarded ops, served as one more registered client of sm-manager's socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os/signal"
	"syscall"

	"github.com/sm-supervisor/sm/api"
	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/cmdmain"
)

func main() { cmdmain.Main("sm-api", run) }

func run() error {
	cfgPath := flag.String("config", "/etc/sm/sm.toml", "path of the TOML configuration (the manager's file; sm-api reads [api] and socket)")
	logJSON := flag.Bool("log-json", false, "log as JSON lines instead of text")
	flag.Parse()

	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return err
	}
	log := cmdmain.Logger(cfg.LogLevel, *logJSON)
	srv, err := api.New(api.Options{Config: cfg, Logger: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.API.Listen)
	if err != nil {
		return fmt.Errorf("api.listen: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return srv.Run(ctx, ln)
}
