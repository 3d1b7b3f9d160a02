// Command sm-manager supervises a sharded bot's cluster processes and routes
// messages between them and its clients over one Unix socket.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/cmdmain"
	"github.com/sm-supervisor/sm/internal/cpuprofile"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/statusws"
	"github.com/sm-supervisor/sm/systemd"
)

func main() { cmdmain.Main("sm-manager", run) }

func run() error {
	cfgPath := flag.String("config", "/etc/sm/sm.toml", "path of the TOML configuration")
	logJSON := flag.Bool("log-json", false, "log as JSON lines instead of text")
	check := flag.Bool("check", false, "validate the configuration and exit")
	hosts := flag.Bool("hosts", false, "print the mesh's hosts and clusters from the running manager's STATUS and exit")
	// Hidden (no usage line): for profiling under load, see docs/performance.md.
	cpuProfile := flag.String("cpuprofile", "", "")
	flag.Usage = usage
	flag.Parse()
	if *cpuProfile != "" {
		stop, err := cpuprofile.Start(*cpuProfile)
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
	if *hosts {
		return printHosts(cfg.Socket, os.Stdout)
	}
	if *check {
		// What a DEPLOY of this file would refuse, -check refuses.
		if err := manager.CheckConfig(cfg); err != nil {
			return err
		}
		fmt.Println("configuration OK:", cfg.Path)
		return nil
	}
	log := cmdmain.Logger(cfg.LogLevel, *logJSON)

	// Discord's /gateway/bot, with a token: total_shards = "auto", the
	// identify buckets and the session-start budget.
	gw, fetch, err := discordGateway(cfg, log)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := manager.New(manager.Options{Config: cfg, Logger: log, Registry: reg, Gateway: gw, FetchGateway: fetch})
	if err != nil {
		return err
	}
	// systemd: sd_notify, watchdog, socket activation; no-ops without it.
	// Read (and unset) its variables before any cluster is spawned.
	notify := systemd.FromEnvironment(log)
	// The IPC socket and the public status page's listener ([status]
	// listen): systemd's sockets, or made here. No os.Remove at exit: a
	// socket made here is unlinked when Run closes it, and one systemd
	// passed is systemd's.
	ln, statusLn, err := systemd.Listeners(cfg, log)
	if err != nil {
		return err
	}
	// Prometheus metrics: [admin] listen (loopback by default).
	var adminLn net.Listener
	if cfg.Admin.Listen != "" {
		if adminLn, err = net.Listen("tcp", cfg.Admin.Listen); err != nil {
			ln.Close()
			if statusLn != nil {
				statusLn.Close()
			}
			return fmt.Errorf("admin.listen: %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	endNotify := notify.Start(ctx, m) // READY, STATUS, watchdog; STOPPING=1 on SIGTERM
	defer endNotify()
	// Logs at info are public: the socket's path goes to DEBUG only.
	log.Info("sm-manager serving", "topology", cfg.Topology.Generation().String(), "pid", os.Getpid())
	log.Debug("sm-manager socket", "socket", cfg.Socket)
	return runAll(ctx, log, cfg, m, reg, ln, statusLn, adminLn)
}

// runAll runs the manager with the status page's server and the metrics
// server (each optional) side by side; either failing stops the others. The
// servers outlive the manager's shutdown, so the page shows the clusters
// stopping, and stop once the manager's Run has returned (by then its feed
// has closed every subscription).
func runAll(ctx context.Context, log *slog.Logger, cfg *config.Config, m *manager.Manager, reg *prometheus.Registry, ln, statusLn, adminLn net.Listener) error {
	g, gctx := errgroup.WithContext(ctx)
	srvCtx, stopSrv := context.WithCancel(context.Background())
	defer stopSrv()
	g.Go(func() error {
		defer stopSrv()
		return m.Run(gctx, ln)
	})
	if statusLn != nil {
		srv := &statusws.Server{
			Feed:           m,
			AllowedOrigins: cfg.Status.AllowedOrigins,
			Logger:         log,
			Buffer:         cfg.Limits.FeedBuffer,
		}
		g.Go(func() error { return srv.Run(srvCtx, statusLn) })
		log.Info("status page serving", "addr", "http://"+statusLn.Addr().String()+"/")
	}
	if adminLn != nil {
		g.Go(func() error { return serveMetrics(srvCtx, reg, adminLn) })
		log.Info("metrics serving", "addr", "http://"+adminLn.Addr().String()+"/metrics")
	}
	return g.Wait()
}

// serveMetrics serves /metrics on ln until ctx is done.
func serveMetrics(ctx context.Context, reg *prometheus.Registry, ln net.Listener) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
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
