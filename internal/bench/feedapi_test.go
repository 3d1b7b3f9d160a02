package bench

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
)

// TestFeedScenario runs the feed scenario small: every subscriber must hear
// heartbeats, none may be dropped, and the figures must be there.
func TestFeedScenario(t *testing.T) {
	out := runScenario(t, 3*time.Minute, "feed",
		"--clusters=4", "--subscribers=50", "--heartbeat=500ms",
		"--warmup=500ms", "--duration=2s", "--idle-sample=500ms")
	var reps []feedReport
	for _, line := range jsonLines(t, out) {
		var r feedReport
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("JSON line %s: %v", line, err)
		}
		reps = append(reps, r)
	}
	if len(reps) != 1 {
		t.Fatalf("%d JSON lines, want 1", len(reps))
	}
	r := reps[0]
	if why := r.Broken(); why != "" {
		t.Error(why)
	}
	if r.Scenario != "feed" || r.Subscribers != 50 || r.Clusters != 4 {
		t.Errorf("wrong shape: %+v", r)
	}
	if r.Heartbeats == 0 || r.MsgPerS <= 0 || r.P50US <= 0 || r.P99US < r.P50US || r.PerSubscriberMin == 0 {
		t.Errorf("empty figures: %+v", r)
	}
	if r.ManagerRSSKiB <= 0 || r.IdleRSSKiB <= 0 || r.ManagerCPUPercent <= 0 {
		t.Errorf("no manager CPU or RSS: %+v", r)
	}
}

// TestAPIScenario runs the api scenario small: no error on any route, and
// every case has figures.
func TestAPIScenario(t *testing.T) {
	out := runScenario(t, 3*time.Minute, "api", "--api-bin", testenv.Bin("sm-api"),
		"--clusters=2", "--concurrency=1,4", "--duration=1s", "--warmup=200ms")
	cases := map[string]int{}
	summaries := 0
	for _, line := range jsonLines(t, out) {
		var c apiCase
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("JSON line %s: %v", line, err)
		}
		switch c.Route {
		case apiRouteSocket, apiRouteGuild, apiRouteOp:
			cases[c.Route]++
			if why := c.Broken(); why != "" {
				t.Errorf("%s %d: %s", c.Route, c.Concurrency, why)
			}
			if c.OK == 0 || c.ReqPerS <= 0 || c.P50US <= 0 || c.P99US < c.P50US {
				t.Errorf("%s %d: empty figures: %s", c.Route, c.Concurrency, line)
			}
			if c.Route != apiRouteSocket && c.RatioToSocket <= 0 {
				t.Errorf("%s %d: no ratio to the socket route: %s", c.Route, c.Concurrency, line)
			}
		case "summary":
			summaries++
		default:
			t.Errorf("unexpected line %s", line)
		}
	}
	if cases[apiRouteSocket] != 2 || cases[apiRouteGuild] != 2 || cases[apiRouteOp] != 2 || summaries != 2 {
		t.Fatalf("got cases %v and %d summaries; want 2 of each route and 2 summaries", cases, summaries)
	}
}

func TestEventTime(t *testing.T) {
	at := time.Date(2026, 11, 29, 22, 49, 4, 612300000, time.UTC)
	for _, tc := range []struct {
		msg           string
		heartbeat, ok bool
	}{
		// As the manager writes it: the fast path.
		{`{"type":"heartbeat","cluster":2,"generation":1,"pid":7,"ready":true,"at":"2026-11-29T22:49:04.6123Z","payload":{"at":"x"}}`, true, true},
		// Another order: encoding/json.
		{`{"at":"2026-11-29T22:49:04.6123Z","type":"heartbeat","cluster":2}`, true, true},
		{`{"type":"cluster","cluster":{"id":1}}`, false, true},
		{`{"type":"heartbeat","cluster":2}`, true, false}, // no "at"
		{`{"type":"heartbeat","at":"yesterday"}`, false, false},
		{`not json`, false, false},
		{`{}`, false, false},
	} {
		got, hb, ok := eventTime([]byte(tc.msg))
		if hb != tc.heartbeat || ok != tc.ok || (hb && ok && !got.Equal(at)) {
			t.Errorf("eventTime(%s) = %v, %v, %v; want heartbeat %v, ok %v", tc.msg, got, hb, ok, tc.heartbeat, tc.ok)
		}
	}
}

// TestHTTPConn checks the bench's HTTP client against net/http's server:
// keep-alive, a body, a chunked answer, and a server that closes.
func TestHTTPConn(t *testing.T) {
	var conns sync.Map
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conns.Store(r.RemoteAddr, true)
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/chunked":
			w.Write([]byte("part one, "))
			w.(http.Flusher).Flush()
			w.Write([]byte("part two"))
		case "/close":
			w.Header().Set("Connection", "close")
			w.Write([]byte("bye"))
		default:
			w.Write(append([]byte(r.Method+" "), body...))
		}
	}))
	srv.Start()
	defer srv.Close()
	c := &httpConn{addr: srv.Listener.Addr().String(), auth: "Bearer tok"}
	defer c.close()
	for _, tc := range []struct {
		method, path, body, want string
	}{
		{"GET", "/a", "", "GET "},
		{"POST", "/b", `{"x":1}`, `POST {"x":1}`},
		{"GET", "/chunked", "", "part one, part two"},
		{"GET", "/close", "", "bye"},
		{"POST", "/c", `[]`, `POST []`},
	} {
		var body []byte
		if tc.body != "" {
			body = []byte(tc.body)
		}
		status, got, err := c.do(tc.method, []byte(tc.path), body)
		if err != nil || status != 200 || string(got) != tc.want {
			t.Fatalf("%s %s: %d %q %v; want 200 %q", tc.method, tc.path, status, got, err, tc.want)
		}
	}
	n := 0
	conns.Range(func(any, any) bool { n++; return true })
	if n != 2 {
		t.Errorf("%d connections, want 2 (one kept alive, one after the server closed)", n)
	}
}
