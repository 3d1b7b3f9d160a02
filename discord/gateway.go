package discord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Defaults of GatewayClient.
const (
	// DefaultBaseURL is Discord's REST API, version 10.
	DefaultBaseURL = "https://discord.com/api/v10"
	// UserAgent is what Discord asks API clients to send: "DiscordBot (url, version)".
	UserAgent = "DiscordBot (https://github.com/sm-supervisor/sm, 1)"
	// DefaultMaxRetries is how often a 429 is retried before GatewayBot gives up.
	DefaultMaxRetries = 3
	// DefaultMaxWait is the longest single rate-limit wait GatewayBot sits out.
	DefaultMaxWait = time.Minute
	// DefaultHTTPTimeout bounds one request when GatewayClient.HTTP is nil.
	DefaultHTTPTimeout = 15 * time.Second
)

// fallbackRetryAfter is the wait after a 429 that names none (a proxy's, say).
const fallbackRetryAfter = time.Second

// maxBody caps how much of an answer is read; /gateway/bot is ~150 bytes.
const maxBody = 1 << 20

// excerptLen is how much of an unexpected body goes into an error.
const excerptLen = 200

// ErrTokenRefused is matched (errors.Is) by the error GatewayBot returns when
// Discord answers 401 or 403: the bot token is wrong, reset or revoked.
var ErrTokenRefused = errors.New("bot token refused by Discord (wrong, reset or revoked); check the token file or environment variable")

// ErrNoToken is returned when there is no token to send: GatewayClient.Token is
// empty, or LoadToken was given neither a file nor an environment variable.
var ErrNoToken = errors.New("no Discord bot token configured")

// GatewayClient asks Discord's GET /gateway/bot. The zero value is not usable:
// Token must be set; every other field has a default. It holds no mutable state
// and is safe for concurrent use. The token is sent only in the Authorization
// header and never appears in an error.
type GatewayClient struct {
	// BaseURL is the REST API root, DefaultBaseURL when empty. Tests and
	// proxies point it elsewhere.
	BaseURL string
	// Token is the bot token, without the "Bot " prefix (see LoadToken).
	Token string
	// HTTP sends the request; when nil, a client with DefaultHTTPTimeout.
	HTTP *http.Client
	// Now stamps GatewayBot.Fetched and resolves an HTTP-date Retry-After;
	// time.Now when nil.
	Now func() time.Time
	// Sleep waits out a 429; when nil, a timer that returns ctx.Err() early
	// if ctx ends. Injected so tests do not wait.
	Sleep func(ctx context.Context, d time.Duration) error
	// MaxRetries is how many 429s are retried: DefaultMaxRetries when 0,
	// none when negative.
	MaxRetries int
	// MaxWait is the longest wait honoured; a 429 asking for more is returned
	// at once as a *RateLimitError (a Cloudflare ban lasts an hour, and start-up
	// should report that rather than hang). DefaultMaxWait when 0.
	MaxWait time.Duration
}

// GatewayBot is Discord's answer to GET /gateway/bot.
type GatewayBot struct {
	// URL is the gateway's WebSocket URL, e.g. "wss://gateway.discord.gg".
	URL string
	// Shards is Discord's recommended shard count.
	Shards int
	// SessionStartLimit is the identify budget as of Fetched.
	SessionStartLimit SessionStartLimit
	// Fetched is when the answer arrived (GatewayClient.Now): the instant
	// ResetAfter counts from, to pass to Budget.Observe.
	Fetched time.Time
}

// SessionStartLimit is the session-start (IDENTIFY) budget of a bot.
type SessionStartLimit struct {
	// Total is the number of session starts allowed per window (1000 for most bots).
	Total int
	// Remaining is how many are left in this window.
	Remaining int
	// ResetAfter is when Remaining goes back to Total, from the moment of the answer.
	ResetAfter time.Duration
	// MaxConcurrency is the number of identify buckets: shard s is in bucket
	// s % MaxConcurrency, and each bucket takes one IDENTIFY per 5 seconds.
	MaxConcurrency int
}

// TotalShards is the shard count sm uses for total_shards = "auto": Discord's
// recommendation rounded up to a multiple of MaxConcurrency, so that every
// identify bucket holds the same number of shards and a start-up takes no
// longer than the fullest bucket needs. Discord already answers multiples for
// large bots; for MaxConcurrency 1 this is Shards unchanged.
func (gb GatewayBot) TotalShards() int {
	n, mc := max(gb.Shards, 1), max(gb.SessionStartLimit.MaxConcurrency, 1)
	return (n + mc - 1) / mc * mc
}

// wireGatewayBot is the JSON Discord sends.
type wireGatewayBot struct {
	URL               *string `json:"url"`
	Shards            *int    `json:"shards"`
	SessionStartLimit *struct {
		Total          int     `json:"total"`
		Remaining      int     `json:"remaining"`
		ResetAfter     float64 `json:"reset_after"` // milliseconds
		MaxConcurrency int     `json:"max_concurrency"`
	} `json:"session_start_limit"`
}

// StatusError is an answer with an unexpected HTTP status. A 401 or 403
// matches ErrTokenRefused.
type StatusError struct {
	StatusCode int
	// Body is the start of the answer, control characters replaced, any
	// occurrence of the token redacted.
	Body string
}

// Error is the status, its text and the start of the body.
func (e *StatusError) Error() string {
	s := "HTTP " + strconv.Itoa(e.StatusCode)
	if t := http.StatusText(e.StatusCode); t != "" {
		s += " " + t
	}
	if e.isTokenRefused() {
		s += ": " + ErrTokenRefused.Error()
	}
	if e.Body != "" {
		s += ": " + e.Body
	}
	return s
}

// Is makes errors.Is(err, ErrTokenRefused) true for 401 and 403.
func (e *StatusError) Is(target error) bool {
	return target == ErrTokenRefused && e.isTokenRefused()
}

func (e *StatusError) isTokenRefused() bool {
	return e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden
}

// RateLimitError is a 429 that GatewayBot gave up on: retries exhausted, or a
// wait longer than MaxWait.
type RateLimitError struct {
	// RetryAfter is the wait Discord asked for on the last 429.
	RetryAfter time.Duration
	// Global is Discord's flag for a limit on the whole bot, not this route.
	Global bool
	// Attempts is how many requests were sent.
	Attempts int
}

// Error says how long Discord asked to wait, and after how many attempts.
func (e *RateLimitError) Error() string {
	scope := ""
	if e.Global {
		scope = " (global)"
	}
	return fmt.Sprintf("rate limited by Discord%s after %d attempt(s); retry after %v", scope, e.Attempts, e.RetryAfter)
}

// GatewayBot asks Discord for the recommended shard count and the session-start
// budget. A 429 is waited out (the longer of the Retry-After header and the
// body's retry_after) and retried up to MaxRetries times; other failures are
// returned at once: a *StatusError (errors.Is ErrTokenRefused on 401/403), a
// *RateLimitError, a transport error, or a decode error. Errors name the URL,
// never the token.
func (c *GatewayClient) GatewayBot(ctx context.Context) (GatewayBot, error) {
	url := strings.TrimRight(c.BaseURL, "/")
	if url == "" {
		url = DefaultBaseURL
	}
	url += "/gateway/bot"
	fail := func(err error) (GatewayBot, error) {
		return GatewayBot{}, fmt.Errorf("discord: GET %s: %w", url, err)
	}
	if c.Token == "" {
		return fail(ErrNoToken)
	}
	if err := checkToken(c.Token); err != nil {
		return fail(err)
	}
	retries := c.MaxRetries
	switch {
	case retries == 0:
		retries = DefaultMaxRetries
	case retries < 0:
		retries = 0
	}
	for attempt := 1; ; attempt++ {
		gb, limited, err := c.try(ctx, url)
		switch {
		case err != nil:
			return fail(err)
		case limited == nil:
			return gb, nil
		}
		limited.Attempts = attempt
		if attempt > retries || limited.RetryAfter > c.maxWait() {
			return fail(limited)
		}
		if err := c.sleep(ctx, limited.RetryAfter); err != nil {
			return fail(err)
		}
	}
}

// try sends one request. A 429 comes back as a *RateLimitError (Attempts not
// set) and no error, for the caller to wait out.
func (c *GatewayClient) try(ctx context.Context, url string) (GatewayBot, *RateLimitError, error) {
	if err := ctx.Err(); err != nil {
		return GatewayBot{}, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return GatewayBot{}, nil, err
	}
	req.Header.Set("Authorization", "Bot "+c.Token)
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set("Accept", "application/json")
	resp, err := c.client().Do(req)
	if err != nil {
		// *url.Error names the URL and the cause; the header is not in it.
		return GatewayBot{}, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return GatewayBot{}, nil, fmt.Errorf("read answer: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		wait, global := c.retryAfter(resp.Header, body)
		return GatewayBot{}, &RateLimitError{RetryAfter: wait, Global: global}, nil
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return GatewayBot{}, nil, &StatusError{StatusCode: resp.StatusCode, Body: c.excerpt(body)}
	}
	gb, err := c.decode(body)
	return gb, nil, err
}

func (c *GatewayClient) decode(body []byte) (GatewayBot, error) {
	var w wireGatewayBot
	if err := json.Unmarshal(body, &w); err != nil {
		return GatewayBot{}, fmt.Errorf("decode answer: %w (body: %s)", err, c.excerpt(body))
	}
	bad := func(why string) (GatewayBot, error) {
		return GatewayBot{}, fmt.Errorf("implausible answer: %s (body: %s)", why, c.excerpt(body))
	}
	switch {
	case w.URL == nil || *w.URL == "":
		return bad("no url")
	case w.Shards == nil || *w.Shards < 1:
		return bad("shards missing or below 1")
	case w.SessionStartLimit == nil:
		return bad("no session_start_limit")
	}
	l := w.SessionStartLimit
	switch {
	case l.Total < 1 || l.Remaining < 0 || l.Remaining > l.Total:
		return bad("session_start_limit total/remaining out of range")
	case l.MaxConcurrency < 1:
		return bad("max_concurrency below 1")
	case l.ResetAfter < 0 || math.IsNaN(l.ResetAfter) || l.ResetAfter > float64(maxDuration/time.Millisecond):
		return bad("reset_after out of range")
	}
	return GatewayBot{
		URL:    *w.URL,
		Shards: *w.Shards,
		SessionStartLimit: SessionStartLimit{
			Total:          l.Total,
			Remaining:      l.Remaining,
			ResetAfter:     time.Duration(l.ResetAfter * float64(time.Millisecond)),
			MaxConcurrency: l.MaxConcurrency,
		},
		Fetched: c.now(),
	}, nil
}

const maxDuration = time.Duration(math.MaxInt64)

// retryAfter reads the wait a 429 asks for: the longer of the Retry-After
// header (seconds, possibly fractional, or an HTTP date) and the body's
// retry_after (seconds), so a retry is never early; fallbackRetryAfter when
// neither is readable.
func (c *GatewayClient) retryAfter(h http.Header, body []byte) (time.Duration, bool) {
	wait, found := time.Duration(0), false
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if d, ok := parseSeconds(v); ok {
			wait, found = d, true
		} else if t, err := http.ParseTime(v); err == nil {
			wait, found = max(t.Sub(c.now()), 0), true
		}
	}
	var b struct {
		RetryAfter *float64 `json:"retry_after"`
		Global     bool     `json:"global"`
	}
	if json.Unmarshal(body, &b) == nil && b.RetryAfter != nil {
		if d, ok := secondsToDuration(*b.RetryAfter); ok {
			wait, found = max(wait, d), true
		}
	}
	global := b.Global || strings.EqualFold(h.Get("X-RateLimit-Global"), "true")
	if !found {
		return fallbackRetryAfter, global
	}
	return wait, global
}

func parseSeconds(s string) (time.Duration, bool) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	return secondsToDuration(f)
}

func secondsToDuration(f float64) (time.Duration, bool) {
	if math.IsNaN(f) || f < 0 || f > float64(maxDuration/time.Second) {
		return 0, false
	}
	return time.Duration(f * float64(time.Second)), true
}

// excerpt is the start of body for an error message: printable, short, and
// with the token (should Discord or a proxy ever echo it) redacted.
func (c *GatewayClient) excerpt(body []byte) string {
	s := string(body)
	if c.Token != "" {
		s = strings.ReplaceAll(s, c.Token, "[token]")
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return ' '
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if r := []rune(s); len(r) > excerptLen {
		s = string(r[:excerptLen]) + "…"
	}
	return s
}

func (c *GatewayClient) client() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

var defaultHTTP = &http.Client{Timeout: DefaultHTTPTimeout}

func (c *GatewayClient) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *GatewayClient) maxWait() time.Duration {
	if c.MaxWait > 0 {
		return c.MaxWait
	}
	return DefaultMaxWait
}

func (c *GatewayClient) sleep(ctx context.Context, d time.Duration) error {
	if c.Sleep != nil {
		return c.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
