// Package statusws is sm-manager's public, read-only status feed: a WebSocket
// that relays the manager's state feed (a snapshot, then events) and the
// embedded status page that renders it, both on one listener.
package statusws

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/manager"
)

// Feed is the state feed the server relays; *manager.Manager satisfies it.
// Subscribe returns manager.ErrTooManySubscribers at the subscriber cap.
type Feed interface {
	Subscribe(buf int) (*manager.Subscription, error)
}

// Defaults for the Server's zero fields.
const (
	DefaultBuffer       = 256
	DefaultWriteTimeout = 5 * time.Second
	DefaultSendBuffer   = 64 << 10
)

// readLimit bounds one message from a subscriber: they are discarded unread,
// and anything bigger closes the connection (StatusMessageTooBig).
const readLimit = 4 << 10

// Server serves the status page and its WebSocket feed. The zero values of the
// optional fields are sensible; Feed is required.
type Server struct {
	// Feed is where events come from: the manager.
	Feed Feed
	// AllowedOrigins are the Origin host patterns (path.Match syntax, as
	// coder/websocket's AcceptOptions.OriginPatterns) a browser may open the
	// WebSocket from, besides the page's own host.
	AllowedOrigins []string
	// Logger receives connection logs (default: discard).
	Logger *slog.Logger
	// Buffer is how many events a subscriber may fall behind before the feed
	// drops it (default DefaultBuffer; sm-manager passes limits.feed_buffer).
	Buffer int
	// WriteTimeout bounds the write of one event to one subscriber (default
	// DefaultWriteTimeout): the backstop for a peer whose TCP window stays shut.
	WriteTimeout time.Duration
	// SendBuffer is each connection's kernel send buffer (default
	// DefaultSendBuffer). Fixed, it stops the kernel from growing it to
	// megabytes for a subscriber that has stopped reading, so what one can
	// hold is bounded and one that stalls is found and dropped in seconds.
	// 64 KiB is still far more than the feed's rate needs on a long-haul link.
	SendBuffer int

	conns tracker
}

// Run serves ln until ctx is cancelled, then closes every WebSocket with
// StatusGoingAway, waits for their handlers, and returns nil. It returns an
// error only if serving fails. A Server runs once.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	if s.Feed == nil {
		return errors.New("statusws: no Feed")
	}
	// stopping ends every WebSocket; it is the request's base context too.
	stopping, stop := context.WithCancel(context.Background())
	defer stop()
	hs := &http.Server{
		Handler:           s.handler(stopping),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(s.log().Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return stopping },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetWriteBuffer(s.sendBuffer())
			}
			return ctx
		},
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		err = fmt.Errorf("statusws: serve: %w", err)
	}
	stop()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if hs.Shutdown(sctx) != nil {
		hs.Close() // a page download to a stalled client: cut it
	}
	cancel()
	s.conns.closeAndWait()
	if err == nil {
		<-served // http.ErrServerClosed
	}
	return err
}

func (s *Server) handler(stopping context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /", pageHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /ws", func(w http.ResponseWriter, r *http.Request) { s.serveWS(stopping, w, r) })
	return mux
}

func (s *Server) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

func (s *Server) buffer() int {
	if s.Buffer <= 0 {
		return DefaultBuffer
	}
	return s.Buffer
}

func (s *Server) sendBuffer() int {
	if s.SendBuffer <= 0 {
		return DefaultSendBuffer
	}
	return s.SendBuffer
}

func (s *Server) writeTimeout() time.Duration {
	if s.WriteTimeout <= 0 {
		return DefaultWriteTimeout
	}
	return s.WriteTimeout
}

// tracker counts WebSocket handlers, which http.Server.Shutdown does not wait
// for once they have hijacked their connection.
type tracker struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// add counts one handler in, unless the server is stopping.
func (t *tracker) add() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	return true
}

func (t *tracker) done() { t.wg.Done() }

func (t *tracker) closeAndWait() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}
