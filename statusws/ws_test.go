package statusws_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/statusws"
)

// A subscriber gets the snapshot first, then every event in the order the
// feed published it: the same sequence as any other subscriber.
func TestSnapshotThenEventsInOrder(t *testing.T) {
	e := start(t, testConfig(t))
	st := e.WaitReady()
	a := e.dial(nil)
	first := read(t, a, 3*time.Second)
	if first.Type != manager.EventSnapshot || first.Status == nil {
		t.Fatalf("first event %s, want a snapshot", first.raw)
	}
	if n := len(first.Status.Clusters); n != 4 {
		t.Fatalf("snapshot has %d clusters, want 4", n)
	}
	for _, c := range first.Status.Clusters {
		if c.State != "ready" || c.PID != st.Clusters[c.ID].PID {
			t.Fatalf("snapshot cluster %+v, want ready with pid %d", c, st.Clusters[c.ID].PID)
		}
	}
	b := e.dial(nil)
	if ev := read(t, b, 3*time.Second); ev.Type != manager.EventSnapshot {
		t.Fatalf("second subscriber's first event %s, want a snapshot", ev.raw)
	}

	// Kill cluster 2: a sees it restarting, then ready again with a new pid.
	victim := st.Clusters[2].PID
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var seqA []*event
	lastAt := map[int]time.Time{}
	sawRestarting, sawBack := false, false
	deadline := time.Now().Add(10 * time.Second)
	for !sawBack {
		if time.Now().After(deadline) {
			t.Fatalf("cluster 2 not seen back (restarting seen: %v)", sawRestarting)
		}
		ev := read(t, a, 3*time.Second)
		seqA = append(seqA, ev)
		switch ev.Type {
		case manager.EventHeartbeat:
			id := ev.heartbeatCluster(t)
			if !ev.At.After(lastAt[id]) {
				t.Fatalf("heartbeat of cluster %d at %v after one at %v: out of order", id, ev.At, lastAt[id])
			}
			lastAt[id] = ev.At
			if id == 2 && ev.PID == victim && sawRestarting {
				t.Fatalf("heartbeat of the killed process after its cluster restarted: %s", ev.raw)
			}
			var stats struct {
				Shards []struct {
					ID int `json:"id"`
				} `json:"shards"`
			}
			if err := json.Unmarshal(ev.Payload, &stats); err != nil || len(stats.Shards) != 2 || stats.Shards[0].ID != 2*id {
				t.Fatalf("heartbeat payload %s is not cluster %d's harness stats", ev.Payload, id)
			}
		case manager.EventCluster:
			cs := ev.clusterStatus(t)
			if cs.ID != 2 {
				continue
			}
			if cs.State == "restarting" {
				sawRestarting = true
			}
			if cs.State == "ready" && cs.PID != victim && cs.PID != 0 {
				if !sawRestarting {
					t.Fatalf("cluster 2 ready again before any restarting event: %s", ev.raw)
				}
				sawBack = true
			}
			if cs.Heartbeat != nil {
				t.Fatalf("cluster event carries a heartbeat: %s", ev.raw)
			}
		}
	}

	// b got the same events in the same order, from the moment it subscribed.
	var seqB [][]byte
	for range 40 {
		seqB = append(seqB, read(t, b, 3*time.Second).raw)
	}
	start := -1
	for i, ev := range seqA {
		if bytes.Equal(ev.raw, seqB[0]) {
			start = i
			break
		}
	}
	if start < 0 {
		t.Fatalf("b's first event %s is not among a's", seqB[0])
	}
	for i := start; i < len(seqA) && i-start < len(seqB); i++ {
		if !bytes.Equal(seqA[i].raw, seqB[i-start]) {
			t.Fatalf("event %d: a got %s, b got %s", i-start, seqA[i].raw, seqB[i-start])
		}
	}
}

// The heartbeat payload is the cluster's own bytes: never parsed and
// re-encoded. The cluster here is a shell script behind cluster-harness's
// exec bridge, sending a payload in a shape no JSON encoder would produce
// (spaces, escapes, a float's trailing zero, an integer beyond float64, HTML
// characters that encoding/json would escape). Any re-encoding on the way —
// harness, manager, feed or WebSocket — would change those bytes.
func TestHeartbeatPayloadBytesUnchanged(t *testing.T) {
	const payload = `{ "shards" : [ {"id":0,"status":"ready"} , {"id":1,"status":"ready"}],` +
		`"note":"<b>caf\u00e9</b> & \"q\"\t\\","n":1.50,"big":12345678901234567890,"e":2E3 ,"empty":{ },"nil":null}`
	if compact, _ := json.Marshal(json.RawMessage(payload)); bytes.Equal(compact, []byte(payload)) {
		t.Fatal("test payload survives re-encoding unchanged: it proves nothing")
	}
	line := `{"op":"HEARTBEAT","ready":true,"payload":` + payload + `}`
	script := "while :; do printf '%s\\n' '" + line + "'; sleep 0.05; done"
	cfg := testConfig(t)
	cfg.Topology.TotalShards = 2 // one cluster
	cfg.Cluster.Command = []string{testenv.Bin("cluster-harness"), "--exec", "--", "/bin/sh", "-c", script}
	cfg.Shutdown.Timeout = dur(300 * time.Millisecond) // the script ignores QUIESCE
	e := start(t, cfg)
	c := e.dial(nil)
	want := []byte(`,"payload":` + payload + `}`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat from the script's cluster")
		}
		ev := read(t, c, 5*time.Second)
		if ev.Type != manager.EventHeartbeat {
			continue
		}
		if !bytes.HasSuffix(ev.raw, want) || !bytes.Equal(ev.Payload, []byte(payload)) {
			t.Fatalf("heartbeat event\n%s\ndoes not end with the payload as sent\n%s", ev.raw, want)
		}
		if !ev.Ready || ev.heartbeatCluster(t) != 0 || ev.PID == 0 {
			t.Fatalf("heartbeat event %s: wrong fields", ev.raw)
		}
		break
	}
	// A snapshot holds the last heartbeat too: the same JSON value (encoding/json
	// compacts a raw message it embeds, so only the value is promised there).
	c2 := e.dial(nil)
	snap := read(t, c2, 3*time.Second)
	if snap.Type != manager.EventSnapshot || len(snap.Status.Clusters) != 1 {
		t.Fatalf("snapshot %s", snap.raw)
	}
	if got := snap.Status.Clusters[0].Heartbeat; !sameJSON(t, got, []byte(payload)) {
		t.Fatalf("snapshot heartbeat %s, want the value of %s", got, payload)
	}
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	if err := da.Decode(&va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := db.Decode(&vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(normNumbers(va), normNumbers(vb))
}

// normNumbers turns json.Numbers into canonical strings: 1.50 and 1.5 alike.
func normNumbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if f, err := v.Float64(); err == nil && f < 1<<53 && f > -(1<<53) {
			return strconv.FormatFloat(f, 'g', -1, 64)
		}
		return v.String()
	case map[string]any:
		for k, x := range v {
			v[k] = normNumbers(x)
		}
	case []any:
		for i, x := range v {
			v[i] = normNumbers(x)
		}
	}
	return v
}

// A subscriber that stops reading falls limits.feed_buffer events behind and
// is dropped, with a close frame saying why; a subscriber that keeps up is
// unaffected. The buffer leaves the fast one room for a burst (four clusters'
// heartbeats land together) and a scheduling hiccup under -race on a busy
// machine: 128 events are 640ms of this feed.
func TestSlowSubscriberDropped(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.FeedBuffer = 128
	cfg.Heartbeat.Interval = dur(20 * time.Millisecond)
	// Small kernel buffers on both ends of the slow connection (the server's
	// is per server, the client's below), so its writes block after a few
	// dozen events rather than the server's default 64 KiB.
	e := startServer(t, cfg, &statusws.Server{SendBuffer: 8 << 10})
	e.WaitReady()

	fast := e.dial(nil)
	var fastGot atomic.Int64
	fastErr := make(chan error, 1)
	go func() {
		for {
			if _, err := tryRead(fast, 5*time.Second); err != nil {
				fastErr <- err
				return
			}
			fastGot.Add(1)
		}
	}()
	// The slow one never reads: once the kernel buffers are full, the server's
	// write to it blocks and its feed buffer fills.
	slow := e.dial(&websocket.DialOptions{HTTPClient: &http.Client{Transport: smallRecvBuf()}})
	testenv.WaitFor(t, 2*time.Second, "two subscribers", func() bool { return e.Subscribers() == 2 })
	began := time.Now()
	testenv.WaitFor(t, 20*time.Second, "the slow subscriber dropped", func() bool { return e.Subscribers() == 1 })
	t.Logf("slow subscriber dropped after %v", time.Since(began).Round(time.Millisecond))

	before := fastGot.Load()
	time.Sleep(300 * time.Millisecond)
	if got := fastGot.Load() - before; got < 20 {
		t.Fatalf("fast subscriber got %d events in 300ms after the drop, want a steady stream", got)
	}
	select {
	case err := <-fastErr:
		t.Fatalf("fast subscriber: %v", err)
	default:
	}

	// The slow one, reading at last, finds the events it had, then the close.
	var err error
	for n := 0; err == nil; n++ {
		if n > 10000 {
			t.Fatal("slow subscriber still receiving")
		}
		_, err = tryRead(slow, 5*time.Second)
	}
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || ce.Reason != statusws.ReasonTooSlow {
		t.Fatalf("slow subscriber ended with %v, want close %v %q", err, websocket.StatusPolicyViolation, statusws.ReasonTooSlow)
	}
	fast.Close(websocket.StatusNormalClosure, "")
	<-fastErr
}

// smallRecvBuf is a transport whose connections have a 4 KiB receive buffer.
func smallRecvBuf() *http.Transport {
	d := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	return &http.Transport{DialContext: d.DialContext}
}

// limits.max_subscribers holds: past it, an HTTP 503 before any upgrade; a
// slot that frees up can be taken again.
func TestSubscriberCap(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.MaxSubscribers = 2
	e := start(t, cfg)
	a := e.dial(nil)
	b := e.dial(nil)
	read(t, a, 3*time.Second)
	read(t, b, 3*time.Second)
	_, resp, err := e.tryDial(nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third subscriber: err %v, response %v; want HTTP 503", err, resp)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	a.Close(websocket.StatusNormalClosure, "")
	testenv.WaitFor(t, 3*time.Second, "a's slot freed", func() bool { return e.Subscribers() == 1 })
	c := e.dial(nil)
	if ev := read(t, c, 3*time.Second); ev.Type != manager.EventSnapshot {
		t.Fatalf("first event %s, want a snapshot", ev.raw)
	}
}

// What a subscriber sends is read and thrown away; the feed goes on. A
// message over the read limit closes the connection rather than be buffered.
func TestSubscriberMessagesIgnored(t *testing.T) {
	e := start(t, testConfig(t))
	e.WaitReady()
	c := e.dial(nil)
	read(t, c, 3*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for i := range 50 {
		typ, msg := websocket.MessageText, []byte(`{"op":"DEPLOY","id":"`+strconv.Itoa(i)+`"}`)
		if i%5 == 0 {
			typ, msg = websocket.MessageBinary, bytes.Repeat([]byte{0xff}, 4000)
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for range 20 {
		read(t, c, 3*time.Second)
	}
	if n := e.Subscribers(); n != 1 {
		t.Fatalf("%d subscribers, want 1", n)
	}
	if st := e.MustStatus(); st.Deploy != nil {
		t.Fatalf("a subscriber's message started a deploy: %+v", st.Deploy)
	}

	// The server may cut the connection while this is still being written.
	werr := c.Write(ctx, websocket.MessageText, bytes.Repeat([]byte("x"), 64<<10))
	var err error
	for err == nil {
		_, err = tryRead(c, 5*time.Second)
	}
	if s := websocket.CloseStatus(err); s != websocket.StatusMessageTooBig && werr == nil {
		t.Fatalf("after an oversized message: %v (status %v), want close %v", err, s, websocket.StatusMessageTooBig)
	}
	testenv.WaitFor(t, 3*time.Second, "the subscription ended", func() bool { return e.Subscribers() == 0 })
}

// Browsers from other sites are refused (403) unless allowed_origins lists
// them; the page's own host always passes, as does a client with no Origin.
func TestOriginChecked(t *testing.T) {
	e := start(t, testConfig(t), "status.example.com", "https://*.ops.example.org")
	for _, tc := range []struct {
		origin string
		ok     bool
	}{
		{"", true},
		{e.url, true},
		{"https://status.example.com", true},
		{"http://STATUS.example.com", true},
		{"https://wall.ops.example.org", true},
		{"http://wall.ops.example.org", false}, // the pattern names https
		{"https://evil.example", false},
		{"https://status.example.com.evil.example", false},
		{"null", false},
	} {
		h := http.Header{}
		if tc.origin != "" {
			h.Set("Origin", tc.origin)
		}
		c, resp, err := e.tryDial(&websocket.DialOptions{HTTPHeader: h})
		switch {
		case tc.ok && err != nil:
			t.Errorf("origin %q refused: %v", tc.origin, err)
		case !tc.ok && (err == nil || resp == nil || resp.StatusCode != http.StatusForbidden):
			t.Errorf("origin %q: err %v, response %v; want HTTP 403", tc.origin, err, resp)
		}
		if c != nil {
			c.Close(websocket.StatusNormalClosure, "")
		}
	}
	// A plain GET is told to upgrade, without a subscription taken.
	resp, err := (&http.Client{Transport: e.transport}).Get(e.url + "/ws")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Fatalf("plain GET /ws: %s, want 426", resp.Status)
	}
}

// Nothing secret reaches a subscriber: not the spawn tokens (read here from
// each cluster's /proc/<pid>/environ, including a respawned one's new token),
// not the environment, not the command line.
func TestNoSecretInFeed(t *testing.T) {
	e := start(t, testConfig(t))
	st := e.WaitReady()
	c := e.dial(nil)

	secrets := map[string]string{} // secret -> what it is
	seen := map[int]bool{}
	learn := func(pid int) {
		if pid <= 0 || seen[pid] {
			return
		}
		seen[pid] = true
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			return // gone already
		}
		for kv := range strings.SplitSeq(string(b), "\x00") {
			if v, ok := strings.CutPrefix(kv, "SM_TOKEN="); ok && v != "" {
				secrets[v] = fmt.Sprintf("SM_TOKEN of pid %d", pid)
			}
		}
	}
	for _, cs := range st.Clusters {
		learn(cs.PID)
	}
	if len(secrets) != 4 {
		t.Fatalf("found %d tokens for 4 clusters", len(secrets))
	}
	for _, s := range []string{"SM_TOKEN", "SM_SOCKET", "SM_SHARD_FIRST", e.cfg.Socket, testenv.Bin("cluster-harness"), "--simulate", "--connect-delay"} {
		secrets[s] = "environment or command line"
	}

	var recorded [][]byte
	killed := false
	respawned := 0
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) || respawned == 0 {
		ev := read(t, c, 5*time.Second)
		recorded = append(recorded, ev.raw)
		switch ev.Type {
		case manager.EventSnapshot:
			for _, cs := range ev.Status.Clusters {
				learn(cs.PID)
			}
		case manager.EventHeartbeat:
			learn(ev.PID)
			if !killed && len(recorded) > 20 {
				killed = true
				syscall.Kill(st.Clusters[1].PID, syscall.SIGKILL)
			}
		case manager.EventCluster:
			cs := ev.clusterStatus(t)
			learn(cs.PID)
			if cs.ID == 1 && cs.PID != st.Clusters[1].PID && cs.State == "ready" {
				respawned = cs.PID
			}
		}
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("cluster 1 did not come back")
		}
	}
	if !seen[respawned] || len(secrets) < 5+7 {
		t.Fatalf("the respawned process's token was not collected (%d secrets)", len(secrets))
	}
	for _, msg := range recorded {
		for s, what := range secrets {
			if bytes.Contains(msg, []byte(s)) {
				t.Fatalf("a feed message holds %s (%q): %s", what, s, msg)
			}
		}
	}
	t.Logf("%d messages, %d secrets checked", len(recorded), len(secrets))
}

// Stopping the manager closes the feed: subscribers get a close frame (going
// away), new ones a 503, and the server still stops cleanly.
func TestManagerStopClosesFeed(t *testing.T) {
	e := start(t, testConfig(t))
	e.WaitReady()
	c := e.dial(nil)
	read(t, c, 3*time.Second)
	stopped := make(chan struct{})
	go func() { defer close(stopped); e.Stop() }()
	var err error
	for err == nil {
		_, err = tryRead(c, 15*time.Second)
	}
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != statusws.ReasonStopping {
		t.Fatalf("subscriber ended with %v, want close %v %q", err, websocket.StatusGoingAway, statusws.ReasonStopping)
	}
	<-stopped
	_, resp, err := e.tryDial(nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("subscribing to a stopped manager: err %v, response %v; want HTTP 503", err, resp)
	}
	e.stopServer()
}

// Stopping the server closes every WebSocket with a close frame and Run
// returns; the manager's feed loses its subscribers.
func TestServerStopClosesSockets(t *testing.T) {
	e := start(t, testConfig(t))
	conns := []*websocket.Conn{e.dial(nil), e.dial(nil), e.dial(nil)}
	for _, c := range conns {
		read(t, c, 3*time.Second)
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			var err error
			for err == nil {
				_, err = tryRead(c, 10*time.Second)
			}
			if s := websocket.CloseStatus(err); s != websocket.StatusGoingAway {
				t.Errorf("subscriber ended with %v, want close %v", err, websocket.StatusGoingAway)
			}
		})
	}
	began := time.Now()
	e.stopServer()
	wg.Wait()
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("server took %v to stop", took)
	}
	if n := e.Subscribers(); n != 0 {
		t.Fatalf("%d feed subscribers left after the server stopped", n)
	}
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(e.url, "http://"), time.Second); err == nil {
		t.Fatal("the listener still accepts after Run returned")
	}
}

// The page and its assets are served with a strict content security policy;
// /healthz answers.
func TestPageServed(t *testing.T) {
	e := start(t, testConfig(t))
	hc := &http.Client{Transport: e.transport}
	get := func(path string, hdr ...string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", e.url+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := get("/")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(body, `src="app.js"`) {
		t.Fatalf("GET /: %s %s\n%.200s", resp.Status, resp.Header.Get("Content-Type"), body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
		t.Fatalf("CSP %q", csp)
	}
	if tag := resp.Header.Get("ETag"); tag == "" {
		t.Error("no ETag on the page")
	} else if r2, _ := get("/", "If-None-Match", tag); r2.StatusCode != http.StatusNotModified {
		t.Errorf("revalidation: %s, want 304", r2.Status)
	}
	for path, ctype := range map[string]string{"/app.js": "text/javascript", "/style.css": "text/css", "/favicon.svg": "image/svg+xml"} {
		resp, body := get(path)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), ctype) || len(body) == 0 {
			t.Errorf("GET %s: %s %q", path, resp.Status, resp.Header.Get("Content-Type"))
		}
		if path == "/app.js" && (strings.Contains(body, "innerHTML") || strings.Contains(body, "insertAdjacentHTML") || strings.Contains(body, "document.write")) {
			t.Error("app.js writes HTML: feed data must only ever be text")
		}
	}
	if resp, body := get("/healthz"); resp.StatusCode != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("GET /healthz: %s %q", resp.Status, body)
	}
	if resp, _ := get("/nope"); resp.StatusCode != 404 {
		t.Errorf("GET /nope: %s, want 404", resp.Status)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/", strings.NewReader("x"))
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %v %v, want 405", err, resp)
	} else {
		resp.Body.Close()
	}
}

// A spawn that fails shows the public a reason with no path, argument or
// environment in it (the command's path is the operator's business), while
// the socket's STATUS keeps the detail.
func TestSpawnFailureReasonIsPublic(t *testing.T) {
	cfg := testConfig(t)
	cfg.Topology.TotalShards, cfg.Topology.ShardsPerCluster = 2, 2
	release := filepath.Join(t.TempDir(), "release-7f3a")
	cfg.Cluster.Command = []string{filepath.Join(release, "bin", "bot"), "--secret-arg"}
	cfg.Cluster.Env = map[string]string{"BOT_SECRET": "hunter2"}
	e := start(t, cfg)
	c := e.dial(nil)
	const want = "spawn failed: no such file or directory"
	var recorded [][]byte
	for got := ""; got == ""; {
		ev := read(t, c, 5*time.Second)
		recorded = append(recorded, ev.raw)
		switch ev.Type {
		case manager.EventSnapshot:
			got = ev.Status.Clusters[0].LastExit
		case manager.EventCluster:
			got = ev.clusterStatus(t).LastExit
		}
		if got != "" && got != want {
			t.Errorf("public last_exit = %q, want %q", got, want)
		}
	}
	for _, msg := range recorded {
		for _, s := range []string{release, "release-7f3a", "bin/bot", "--secret-arg", "BOT_SECRET", "hunter2"} {
			if bytes.Contains(msg, []byte(s)) {
				t.Errorf("a feed message holds %q: %s", s, msg)
			}
		}
	}
	if got := e.MustStatus().Clusters[0].LastExit; !strings.Contains(got, filepath.Join(release, "bin", "bot")) || !strings.Contains(got, "no such file or directory") {
		t.Errorf("STATUS last_exit = %q, want the path and the cause", got)
	}
}
