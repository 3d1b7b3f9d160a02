package discord_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
)

// testToken looks like a real token, so a leak into an error would be seen.
const testToken = "MTA5ODc2NTQzMjEwOTg3NjU0.GhIjKl.s3cr3t-t0k3n_abcdefghijklmnopqrstuvwxyz"

const okBody = `{"url":"wss://gateway.discord.gg","shards":9,"session_start_limit":{"total":1000,"remaining":999,"reset_after":14400000,"max_concurrency":1}}`

// fakeDiscord is Discord's GET /gateway/bot as far as these tests need it:
// each request gets the next scripted answer (the last one repeats).
type fakeDiscord struct {
	t       *testing.T
	srv     *httptest.Server
	mu      sync.Mutex
	answers []answer
	reqs    []*http.Request
}

type answer struct {
	status int
	header map[string]string
	body   string
}

func newFakeDiscord(t *testing.T, answers ...answer) *fakeDiscord {
	f := &fakeDiscord{t: t, answers: answers}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		f.srv.Client().CloseIdleConnections()
		f.srv.Close()
	})
	return f
}

func (f *fakeDiscord) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.reqs = append(f.reqs, r.Clone(context.Background()))
	a := f.answers[0]
	if len(f.answers) > 1 {
		f.answers = f.answers[1:]
	}
	f.mu.Unlock()
	if r.Method != http.MethodGet || r.URL.Path != "/api/v10/gateway/bot" {
		http.NotFound(w, r)
		return
	}
	for k, v := range a.header {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	_, _ = w.Write([]byte(a.body))
}

func (f *fakeDiscord) requests() []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slicesClone(f.reqs)
}

func slicesClone[T any](s []T) []T { return append([]T(nil), s...) }

// client returns a GatewayClient aimed at f whose sleeps are recorded, not slept.
func (f *fakeDiscord) client(sleeps *[]time.Duration) *discord.GatewayClient {
	return &discord.GatewayClient{
		BaseURL: f.srv.URL + "/api/v10/",
		Token:   testToken,
		HTTP:    f.srv.Client(),
		Now:     func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) },
		Sleep: func(ctx context.Context, d time.Duration) error {
			*sleeps = append(*sleeps, d)
			return ctx.Err()
		},
	}
}

func TestGatewayBotParses(t *testing.T) {
	f := newFakeDiscord(t, answer{status: 200, body: okBody})
	var sleeps []time.Duration
	gb, err := f.client(&sleeps).GatewayBot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := discord.GatewayBot{
		URL:    "wss://gateway.discord.gg",
		Shards: 9,
		SessionStartLimit: discord.SessionStartLimit{
			Total: 1000, Remaining: 999, ResetAfter: 4 * time.Hour, MaxConcurrency: 1,
		},
		Fetched: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	if gb != want {
		t.Errorf("got %+v\nwant %+v", gb, want)
	}
	if len(sleeps) != 0 {
		t.Errorf("slept %v on a 200", sleeps)
	}
	reqs := f.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if got := r.Header.Get("Authorization"); got != "Bot "+testToken {
		t.Errorf("Authorization header is wrong (length %d)", len(got))
	}
	if got := r.Header.Get("User-Agent"); got != "DiscordBot (https://github.com/sm-supervisor/sm, 1)" {
		t.Errorf("User-Agent = %q", got)
	}
}

func TestGatewayBotDefaultBaseURL(t *testing.T) {
	// Only the URL is checked: an unreachable host fails in the transport,
	// and the error names Discord's real API.
	c := &discord.GatewayClient{Token: testToken, HTTP: &http.Client{Transport: failingTransport{}}}
	_, err := c.GatewayBot(context.Background())
	if err == nil || !strings.Contains(err.Error(), "https://discord.com/api/v10/gateway/bot") {
		t.Fatalf("err = %v, want one naming the default URL", err)
	}
	assertNoToken(t, err)
}

type failingTransport struct{}

func (failingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("no network in this test")
}

func TestTotalShards(t *testing.T) {
	tests := []struct{ shards, mc, want int }{
		{9, 1, 9}, {1, 1, 1}, {0, 1, 1}, {16, 16, 16}, {17, 16, 32}, {5, 4, 8}, {8, 4, 8}, {3, 0, 3},
	}
	for _, tt := range tests {
		gb := discord.GatewayBot{Shards: tt.shards, SessionStartLimit: discord.SessionStartLimit{MaxConcurrency: tt.mc}}
		if got := gb.TotalShards(); got != tt.want {
			t.Errorf("TotalShards(shards %d, max_concurrency %d) = %d, want %d", tt.shards, tt.mc, got, tt.want)
		}
	}
}

func TestGatewayBot429(t *testing.T) {
	limited := func(header map[string]string, body string) answer {
		return answer{status: 429, header: header, body: body}
	}
	ok := answer{status: 200, body: okBody}
	tests := []struct {
		name       string
		answers    []answer
		maxRetries int
		wantSleeps []time.Duration
		wantErr    bool
	}{
		{"Retry-After header", []answer{limited(map[string]string{"Retry-After": "2"}, ""), ok},
			0, []time.Duration{2 * time.Second}, false},
		{"fractional Retry-After header", []answer{limited(map[string]string{"Retry-After": "0.25"}, ""), ok},
			0, []time.Duration{250 * time.Millisecond}, false},
		{"body retry_after", []answer{limited(nil, `{"message":"You are being rate limited.","retry_after":1.5,"global":false}`), ok},
			0, []time.Duration{1500 * time.Millisecond}, false},
		{"the longer of header and body", []answer{limited(map[string]string{"Retry-After": "3"}, `{"retry_after":2.5}`), ok},
			0, []time.Duration{3 * time.Second}, false},
		{"body longer than header", []answer{limited(map[string]string{"Retry-After": "1"}, `{"retry_after":1.75}`), ok},
			0, []time.Duration{1750 * time.Millisecond}, false},
		{"HTTP-date Retry-After", []answer{limited(map[string]string{"Retry-After": "Fri, 02 Jan 2026 03:04:09 GMT"}, ""), ok},
			0, []time.Duration{4 * time.Second}, false},
		{"no hint waits a second", []answer{limited(nil, "<html>slow down</html>"), ok},
			0, []time.Duration{time.Second}, false},
		{"twice then success", []answer{limited(map[string]string{"Retry-After": "1"}, ""), limited(map[string]string{"Retry-After": "2"}, ""), ok},
			0, []time.Duration{time.Second, 2 * time.Second}, false},
		{"retries exhausted (default 3)", []answer{limited(map[string]string{"Retry-After": "1"}, "")},
			0, []time.Duration{time.Second, time.Second, time.Second}, true},
		{"MaxRetries 1", []answer{limited(map[string]string{"Retry-After": "1"}, "")},
			1, []time.Duration{time.Second}, true},
		{"negative MaxRetries: no retry", []answer{limited(map[string]string{"Retry-After": "1"}, ""), ok},
			-1, nil, true},
		{"a wait over MaxWait is not sat out", []answer{limited(map[string]string{"Retry-After": "3600"}, `{"retry_after":3600,"global":true}`), ok},
			0, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeDiscord(t, tt.answers...)
			var sleeps []time.Duration
			c := f.client(&sleeps)
			c.MaxRetries = tt.maxRetries
			gb, err := c.GatewayBot(context.Background())
			if !slices.Equal(sleeps, tt.wantSleeps) {
				t.Errorf("slept %v, want %v", sleeps, tt.wantSleeps)
			}
			if tt.wantErr {
				var rl *discord.RateLimitError
				if !errors.As(err, &rl) {
					t.Fatalf("err = %v, want a *RateLimitError", err)
				}
				if rl.Attempts != len(f.requests()) {
					t.Errorf("Attempts = %d, sent %d", rl.Attempts, len(f.requests()))
				}
				assertNoToken(t, err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if gb.Shards != 9 {
				t.Errorf("Shards = %d after retries", gb.Shards)
			}
		})
	}
}

func TestGatewayBotGlobalLimit(t *testing.T) {
	f := newFakeDiscord(t, answer{status: 429, header: map[string]string{"Retry-After": "3600", "X-RateLimit-Global": "true"}})
	var sleeps []time.Duration
	_, err := f.client(&sleeps).GatewayBot(context.Background())
	var rl *discord.RateLimitError
	if !errors.As(err, &rl) || !rl.Global || rl.RetryAfter != time.Hour || rl.Attempts != 1 {
		t.Fatalf("err = %#v, want a global 1h *RateLimitError after 1 attempt", err)
	}
	if !strings.Contains(err.Error(), "global") {
		t.Errorf("error %q does not say the limit is global", err)
	}
}

func TestGatewayBotSleepCancelled(t *testing.T) {
	f := newFakeDiscord(t, answer{status: 429, header: map[string]string{"Retry-After": "600"}})
	// The real sleep, cut short by the context.
	c := &discord.GatewayClient{BaseURL: f.srv.URL + "/api/v10", Token: testToken, HTTP: f.srv.Client(), MaxWait: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.GatewayBot(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the deadline took %v to end the wait", d)
	}
	if n := len(f.requests()); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

func TestGatewayBotFailures(t *testing.T) {
	tests := []struct {
		name       string
		a          answer
		refused    bool
		wantStatus int
		wantInErr  []string
	}{
		{"401", answer{status: 401, body: `{"message": "401: Unauthorized", "code": 0}`}, true, 401,
			[]string{"401", "token refused by Discord", "401: Unauthorized"}},
		{"403", answer{status: 403, body: `{"message": "Missing Access", "code": 50001}`}, true, 403,
			[]string{"403", "token refused by Discord"}},
		{"500", answer{status: 500, body: "upstream exploded\n\x00 in a way " + strings.Repeat("x", 500)}, false, 500,
			[]string{"HTTP 500 Internal Server Error", "upstream exploded", "…"}},
		{"502 echoing the token", answer{status: 502, body: "bad gateway for Bot " + testToken}, false, 502,
			[]string{"[token]"}},
		{"bad JSON", answer{status: 200, body: `{"url":"wss://x","shards":`}, false, 0,
			[]string{"decode answer"}},
		{"not JSON at all", answer{status: 200, body: `<html>` + testToken + `</html>`}, false, 0,
			[]string{"decode answer", "[token]"}},
		{"wrong type", answer{status: 200, body: `{"url":"wss://x","shards":"nine"}`}, false, 0,
			[]string{"decode answer"}},
		{"no shards", answer{status: 200, body: `{"url":"wss://x","session_start_limit":{"total":1,"remaining":1,"reset_after":1,"max_concurrency":1}}`}, false, 0,
			[]string{"implausible", "shards"}},
		{"no limit", answer{status: 200, body: `{"url":"wss://x","shards":1}`}, false, 0,
			[]string{"implausible", "session_start_limit"}},
		{"zero max_concurrency", answer{status: 200, body: `{"url":"wss://x","shards":1,"session_start_limit":{"total":1,"remaining":1,"reset_after":1,"max_concurrency":0}}`}, false, 0,
			[]string{"implausible", "max_concurrency"}},
		{"remaining above total", answer{status: 200, body: `{"url":"wss://x","shards":1,"session_start_limit":{"total":1,"remaining":2,"reset_after":1,"max_concurrency":1}}`}, false, 0,
			[]string{"implausible"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeDiscord(t, tt.a)
			var sleeps []time.Duration
			_, err := f.client(&sleeps).GatewayBot(context.Background())
			if err == nil {
				t.Fatal("no error")
			}
			if got := errors.Is(err, discord.ErrTokenRefused); got != tt.refused {
				t.Errorf("errors.Is(err, ErrTokenRefused) = %v, want %v (err: %v)", got, tt.refused, err)
			}
			var se *discord.StatusError
			if tt.wantStatus != 0 && (!errors.As(err, &se) || se.StatusCode != tt.wantStatus) {
				t.Errorf("err = %v, want a *StatusError with status %d", err, tt.wantStatus)
			}
			for _, s := range tt.wantInErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if strings.ContainsAny(err.Error(), "\n\x00") {
				t.Errorf("error %q holds control characters", err)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error is %d bytes long", len(err.Error()))
			}
			if len(sleeps) != 0 || len(f.requests()) != 1 {
				t.Errorf("retried: %d requests, sleeps %v", len(f.requests()), sleeps)
			}
			assertNoToken(t, err)
		})
	}
}

func TestGatewayBotBadToken(t *testing.T) {
	for _, tok := range []string{"", "two\nlines", "with space", "Bot " + testToken} {
		c := &discord.GatewayClient{Token: tok, HTTP: &http.Client{Transport: failingTransport{}}}
		_, err := c.GatewayBot(context.Background())
		if err == nil || strings.Contains(err.Error(), "no network") {
			t.Errorf("token %q: err = %v, want a refusal before any request", tok, err)
			continue
		}
		if tok != "" && strings.Contains(err.Error(), tok) {
			t.Errorf("error %q contains the token", err)
		}
		if tok == "" && !errors.Is(err, discord.ErrNoToken) {
			t.Errorf("empty token: err = %v, want ErrNoToken", err)
		}
	}
}

// assertNoToken fails if err, or anything in its chain, shows the token or a
// recognisable piece of it.
func assertNoToken(t *testing.T, err error) {
	t.Helper()
	for e := err; e != nil; e = errors.Unwrap(e) {
		for _, piece := range []string{testToken, "s3cr3t-t0k3n", strings.Split(testToken, ".")[0]} {
			if strings.Contains(e.Error(), piece) {
				t.Errorf("error %q contains (part of) the token", e)
			}
		}
	}
}
