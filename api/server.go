// Package api is sm-api: the HTTP API in front of sm-manager. It is one more
// registered client of the manager's Unix socket, no more: it learns state
// through the read-only WATCH feed and STATUS, and acts only through DEPLOY
// and forwarded business ops, so it can be restarted or redeployed on its own.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/backoff"
	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/ipc"
)

// ClientName is the name sm-api REGISTERs with.
const ClientName = "sm-api"

// Options configure a Server; only Config is required.
type Options struct {
	// Config is the file the manager runs from: sm-api reads its [api] table,
	// the socket path and the frame limit.
	Config *config.Config
	// Getenv looks up api.token_env (default os.Getenv).
	Getenv func(string) string
	// Logger receives structured logs (default: discard).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Backoff paces reconnection to the manager (default 50ms..1s, ±20%: a
	// dial of a missing socket costs nothing, and an API should be back as
	// soon as its manager is).
	Backoff backoff.Policy
}

// Server is sm-api: the HTTP handlers and the manager client behind them.
type Server struct {
	cfg     config.API
	socket  string
	log     *slog.Logger
	client  *ipc.Client
	auth    *authenticator
	state   *stateCache
	metrics *metrics
	handler http.Handler

	rewatch chan struct{} // a WATCH is needed: new connection, or the feed dropped us
	ran     sync.Once
}

// graceTime is how much longer sm-api waits for a reply than the deadline it
// gives the manager, so the manager's own verdict (timeout, or unavailable:
// no ready process before the deadline) is what the caller gets.
const graceTime = 250 * time.Millisecond

// New loads the API token and builds a Server. It fails, and sm-api must not
// start, when there is no usable token.
func New(opts Options) (*Server, error) {
	if opts.Config == nil {
		return nil, errors.New("api: no config")
	}
	cfg := opts.Config
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	token, err := LoadToken(cfg.API, getenv, log)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if cfg.API.WriteTimeout.Duration <= cfg.API.RequestTimeout.Duration+graceTime {
		log.Warn("api.write_timeout does not exceed api.request_timeout: slow requests will be cut off before they can answer",
			"write_timeout", cfg.API.WriteTimeout.Duration, "request_timeout", cfg.API.RequestTimeout.Duration)
	}
	bo := opts.Backoff
	if bo.Min == 0 {
		bo = backoff.Policy{Min: 50 * time.Millisecond, Max: time.Second, Jitter: 0.2}
	}
	s := &Server{
		cfg:     cfg.API,
		socket:  cfg.Socket,
		log:     log,
		auth:    newAuthenticator(token),
		rewatch: make(chan struct{}, 1),
		// Heartbeats flow all the time; a feed silent for a heartbeat
		// timeout is stuck or gone.
		state: &stateCache{now: now, maxQuiet: cfg.Heartbeat.Timeout.Duration},
	}
	s.client = ipc.NewClient(ipc.ClientConfig{
		Path:      cfg.Socket,
		Register:  ipc.Frame{Role: ipc.RoleClient, Name: ClientName},
		Options:   ipc.Options{MaxFrameBytes: cfg.Limits.MaxFrameBytes},
		Handler:   s.onFrame,
		OnConnect: s.onConnect,
		Reconnect: true,
		Backoff:   bo,
		Logger:    log,
	})
	s.metrics = newMetrics(s.client.Connected, s.state.isSynced)
	s.handler = s.metrics.instrument(s.routes())
	return s, nil
}

// Handler returns the HTTP API. Until Run has connected to the manager,
// everything but /healthz and /metrics answers 503.
func (s *Server) Handler() http.Handler { return s.handler }

// Run serves the API on ln and keeps sm-api registered with the manager,
// reconnecting with backoff, until ctx is done: then it stops taking
// requests, lets those in flight finish (each has a deadline), disconnects
// and returns nil. It returns an error if ln fails or the manager refuses
// sm-api's REGISTER outright. Run may be called once.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	first := false
	s.ran.Do(func() { first = true })
	if !first {
		return errors.New("api: Server.Run called twice")
	}
	// The client outlives ctx until the HTTP requests in flight are answered.
	clientCtx, stopClient := context.WithCancel(context.WithoutCancel(ctx))
	defer stopClient()
	clientDone := make(chan error, 1)
	go func() { clientDone <- s.client.Run(clientCtx) }()
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); s.watchLoop(clientCtx) }()

	srv := &http.Server{
		Handler:           s.handler,
		ReadTimeout:       s.cfg.ReadTimeout.Duration,
		ReadHeaderTimeout: min(s.cfg.ReadTimeout.Duration, 5*time.Second),
		WriteTimeout:      s.cfg.WriteTimeout.Duration,
		IdleTimeout:       s.cfg.IdleTimeout.Duration,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(ln) }()
	s.log.Info("sm-api serving", "addr", ln.Addr().String())
	s.log.Debug("sm-api's manager socket", "socket", s.socket)

	var err error
	select {
	case <-ctx.Done():
		// Every request has a deadline of at most request_timeout (plus a
		// grace), so this wait is bounded; the extra second covers writing.
		sctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout.Duration+graceTime+time.Second)
		if serr := srv.Shutdown(sctx); serr != nil {
			s.log.Warn("sm-api: requests still running at shutdown were cut off", "err", serr)
			srv.Close()
		}
		cancel()
		<-serveDone
	case err = <-serveDone:
		err = fmt.Errorf("api: serve: %w", err)
	case err = <-clientDone:
		clientDone <- err
		err = fmt.Errorf("api: manager client: %w", err)
		srv.Close()
		<-serveDone
	}
	stopClient()
	<-clientDone
	<-watchDone
	s.log.Info("sm-api stopped")
	return err
}

// onConnect runs after each REGISTER: the state copy of an earlier connection
// is worthless, so it is dropped and a WATCH asked for.
func (s *Server) onConnect(_ *ipc.Client, _ *ipc.Frame) {
	s.metrics.connects.Inc()
	s.state.reset()
	s.log.Info("connected to the manager")
	s.needWatch()
}

// onFrame receives what the manager sends unasked: EVENT frames of the feed.
// It runs on the client's read goroutine, so it only updates the cache.
func (s *Server) onFrame(_ *ipc.Client, f *ipc.Frame) {
	if f.Op != ipc.OpEvent {
		return // a late REPLY to a request that gave up waiting, say
	}
	if s.state.apply(f.Payload) {
		s.metrics.feedLost.Inc()
		s.log.Warn("state feed lost (dropped or unreadable); watching again")
		s.needWatch()
	}
}

func (s *Server) needWatch() {
	select {
	case s.rewatch <- struct{}{}:
	default: // one is pending already
	}
}

// watchLoop sends WATCH whenever one is needed. If the manager refuses it,
// the cache stays out of sync and requests ask STATUS instead: slower, never
// wrong.
func (s *Server) watchLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.rewatch:
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout.Duration)
		_, err := s.client.Request(rctx, &ipc.Frame{Op: ipc.OpWatch})
		cancel()
		switch code := ipc.CodeOf(err); {
		case err == nil:
		case ctx.Err() != nil:
			return
		case code == ipc.CodeTimeout && s.client.Connected():
			s.log.Warn("WATCH timed out; asking again", "err", err)
			s.needWatch()
		default:
			// unavailable: the next connection asks again. Refused (busy,
			// forbidden): STATUS serves until then.
			s.log.Warn("WATCH failed; answering from STATUS", "err", err)
		}
	}
}
