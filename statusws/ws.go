package statusws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync/atomic"

	"github.com/coder/websocket"

	"github.com/sm-supervisor/sm/manager"
)

// Close reasons a subscriber may see.
const (
	ReasonTooSlow  = "too slow"         // StatusPolicyViolation: the feed dropped it
	ReasonStopping = "manager stopping" // StatusGoingAway: the feed or the server ended
)

var connSeq atomic.Uint64

// serveWS upgrades a request to a feed subscription. The cheap refusals
// (origin, not an upgrade) come before Subscribe, which costs the manager's
// loop a snapshot; the cap's refusal is an HTTP 503 before any upgrade.
func (s *Server) serveWS(stopping context.Context, w http.ResponseWriter, r *http.Request) {
	if !s.conns.add() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	defer s.conns.done()
	log := s.log().With("conn", connSeq.Add(1), "remote", r.RemoteAddr)
	if err := checkOrigin(r, s.AllowedOrigins); err != nil {
		log.Debug("status subscriber refused", "err", err)
		http.Error(w, "origin not allowed", http.StatusForbidden)
		return
	}
	if !headerHasToken(r.Header, "Upgrade", "websocket") {
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		http.Error(w, "this endpoint is a WebSocket", http.StatusUpgradeRequired)
		return
	}
	sub, err := s.Feed.Subscribe(s.buffer())
	if err != nil {
		w.Header().Set("Retry-After", "5")
		if errors.Is(err, manager.ErrTooManySubscribers) {
			log.Warn("status subscriber refused: at limits.max_subscribers")
			http.Error(w, "too many subscribers", http.StatusServiceUnavailable)
		} else {
			http.Error(w, "feed unavailable", http.StatusServiceUnavailable)
		}
		return
	}
	defer sub.Cancel()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: s.AllowedOrigins})
	if err != nil {
		log.Debug("status subscriber refused", "err", err) // Accept wrote the response
		return
	}
	log.Debug("status subscriber connected")
	s.relay(stopping, log, c, sub)
}

// relay writes each feed event to c as one text message, bytes unchanged,
// until the subscription ends, the peer goes, a write fails, or stopping.
func (s *Server) relay(stopping context.Context, log *slog.Logger, c *websocket.Conn, sub *manager.Subscription) {
	c.SetReadLimit(readLimit)
	peerGone := make(chan struct{})
	go func() {
		defer close(peerGone)
		discard(c)
	}()
	code, reason := websocket.StatusGoingAway, ReasonStopping
loop:
	for {
		select {
		case msg, ok := <-sub.C:
			if !ok {
				if sub.Dropped() {
					code, reason = websocket.StatusPolicyViolation, ReasonTooSlow
				}
				break loop
			}
			if err := s.write(c, msg); err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					log.Info("status subscriber dropped: write timed out", "timeout", s.writeTimeout())
				} else {
					log.Debug("status subscriber gone", "err", err)
				}
				c.CloseNow()
				<-peerGone
				return
			}
		case <-peerGone:
			log.Debug("status subscriber gone")
			c.CloseNow()
			return
		case <-stopping.Done():
			break loop
		}
	}
	if reason == ReasonTooSlow {
		log.Info("status subscriber dropped: too slow", "feed_buffer", s.buffer())
	}
	sub.Cancel() // nothing more queues for us during the close handshake
	c.Close(code, reason)
	<-peerGone
	log.Debug("status subscriber closed", "code", code, "reason", reason)
}

func (s *Server) write(c *websocket.Conn, msg []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.writeTimeout())
	defer cancel()
	return c.Write(ctx, websocket.MessageText, msg)
}

// discard reads and drops whatever the peer sends, so control frames (ping,
// close) are answered, until the connection ends. Each message is streamed to
// io.Discard, never buffered; one over readLimit closes the connection.
func discard(c *websocket.Conn) {
	for {
		_, r, err := c.Reader(context.Background())
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, r); err != nil {
			return
		}
	}
}

// checkOrigin refuses a browser on another site, as websocket.Accept would
// (same rules: the request's own host, or a pattern of allowed), so that it is
// answered before a subscription is taken. A request with no Origin (not a
// browser) passes.
func checkOrigin(r *http.Request, allowed []string) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil {
		return fmt.Errorf("origin %q: %w", origin, err)
	}
	if strings.EqualFold(r.Host, u.Host) {
		return nil
	}
	for _, p := range allowed {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(target)); ok {
			return nil
		}
	}
	return fmt.Errorf("origin %q is not allowed for host %q", origin, r.Host)
}

// headerHasToken reports whether the comma-separated header key holds token.
func headerHasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
