package statusws_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/statusws"
)

// The status page in a real headless Chromium against a real manager: it
// renders every cluster and shard, follows a cluster killed and respawned,
// shows a deploy's progress, and reconnects by itself when the manager
// restarts. Screenshots go to $SM_ARTIFACTS (default .artifacts/).
func TestPageInChromium(t *testing.T) {
	exe := chromium(t)
	cfg := testConfig(t)
	cfg.Heartbeat.Interval = dur(100 * time.Millisecond)
	cfg.Heartbeat.Timeout = dur(3 * time.Second) // Chromium and -race share two cores
	cfg.Restart.BackoffMin = dur(700 * time.Millisecond)
	cfg.Restart.BackoffMax = dur(2 * time.Second)
	cfg.Restart.Jitter = 0
	cfg.Shutdown.Timeout = dur(2 * time.Second)
	testenv.WriteConfig(t, cfg)
	e := start(t, cfg)
	st := e.WaitReady()

	b := newBrowser(t, exe)
	b.run(chromedp.Navigate(e.url + "/"))
	b.eval(recorderJS, nil)

	// Every cluster and each of its shards, as the manager has them.
	b.waitJS("4 ready cards of 2 ready shards, feed live", 10*time.Second, `(() => {
		const cards = [...document.querySelectorAll('.card')];
		return document.getElementById('conn').dataset.state === 'live' && cards.length === 4 &&
			cards.every(c => c.dataset.state === 'ready' &&
				c.querySelectorAll('.cell[data-status="ready"]').length === 2);
	})()`)
	for _, cs := range st.Clusters {
		text := strings.ToLower(b.cardText(cs.ID))
		for _, want := range []string{fmt.Sprintf("#%d", cs.ID), fmt.Sprintf("pid %d", cs.PID), "guilds", "g1", "ready"} {
			if !strings.Contains(text, want+"\n") && !strings.Contains(text, want+" ") {
				t.Fatalf("card %d says %q, want it to mention %q", cs.ID, text, want)
			}
		}
	}
	var summary string
	b.eval(`document.getElementById('summary').textContent`, &summary)
	if !strings.Contains(summary, "4/4 ready") || !strings.Contains(summary, "8/8 ready") {
		t.Fatalf("summary %q, want 4/4 clusters and 8/8 shards ready", summary)
	}
	b.screenshot("statusws-page.png")

	// Kill cluster 1: its card goes restarting, then ready with a new process.
	if err := syscall.Kill(st.Clusters[1].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b.waitJS("cluster 1 shown restarting", 5*time.Second, `window.__seen.includes('card1=restarting/g1')`)
	b.waitJS("cluster 1 shown ready again", 10*time.Second, `(() => {
		const s = window.__seen, i = s.lastIndexOf('card1=restarting/g1');
		return i >= 0 && s.indexOf('card1=ready/g1', i) > i;
	})()`)
	newPID := e.WaitReady().Clusters[1].PID
	b.waitJS("cluster 1's new pid and restart count", 5*time.Second, fmt.Sprintf(`(() => {
		const t = document.querySelector('.card[data-cluster="1"]').textContent;
		return t.includes('pid %d') && t.includes('↻ 1');
	})()`, newPID))

	// A deploy: its panel follows it to the end, cluster by cluster.
	next := *cfg
	next.Cluster.Command = []string{testenv.Bin("cluster-harness"), "--simulate", "--connect-delay=300ms", "--event-interval=0"}
	testenv.WriteConfig(t, &next)
	reply := deploy(t, cfg.Socket)
	t.Logf("DEPLOY reply %s", reply)
	b.waitJS("deploy panel running, a cluster done and one in progress", 15*time.Second, `(() => {
		const d = document.getElementById('deploy'), rows = [...d.querySelectorAll('.dep-row')];
		return !d.hidden && d.dataset.state === 'running' &&
			rows.some(r => r.dataset.phase === 'activated') &&
			rows.some(r => r.dataset.phase !== 'activated' && r.dataset.phase !== 'pending');
	})()`)
	b.screenshot("statusws-page-deploy.png")
	b.waitJS("deploy succeeded, every card on generation 2", 20*time.Second, `(() => {
		const d = document.getElementById('deploy'), cards = [...document.querySelectorAll('.card')];
		return d.dataset.state === 'succeeded' && d.dataset.progress === '100' && cards.length === 4 &&
			cards.every(c => c.dataset.state === 'ready' && c.dataset.generation === '2');
	})()`)
	var seen []string
	b.eval(`window.__seen`, &seen)
	for c := range 4 {
		// The new process's 600ms of connecting shards are always on screen;
		// phases a frame apart may be drawn as one, so only these are certain.
		if !containsAny(seen, fmt.Sprintf("phase%d=spawned", c), fmt.Sprintf("phase%d=ready", c)) ||
			!containsAny(seen, fmt.Sprintf("phase%d=activated", c)) {
			t.Errorf("cluster %d's deploy phases not all shown: %v", c, seen)
		}
	}
	if !containsAny(seen, "deploy=running") || !containsAny(seen, "deploy=succeeded") {
		t.Errorf("deploy states shown: %v", seen)
	}
	b.screenshot("statusws-page-final.png")

	// The manager restarts (a new one on the same address): the page shows
	// it is offline, then the new manager's clusters, on its own.
	addr := strings.TrimPrefix(e.url, "http://")
	e.Stop()
	e.stopServer()
	b.waitJS("page offline", 5*time.Second, `document.getElementById('conn').dataset.state === 'offline'`)
	b.screenshot("statusws-page-offline.png")
	cfg2 := testConfig(t)
	e2 := startAt(t, cfg2, &statusws.Server{}, addr)
	st2 := e2.WaitReady()
	b.waitJS("page back with the new manager's clusters", 15*time.Second, fmt.Sprintf(`(() => {
		const c = document.querySelector('.card[data-cluster="0"]');
		return document.getElementById('conn').dataset.state === 'live' && c &&
			c.textContent.includes('pid %d') && document.getElementById('deploy').hidden;
	})()`, st2.Clusters[0].PID))
	b.checkConsole()
}

func containsAny(list []string, want ...string) bool {
	for _, s := range list {
		for _, w := range want {
			if s == w {
				return true
			}
		}
	}
	return false
}

// recorderJS keeps, in window.__seen, every state the page has drawn: each
// card's state and generation, the deploy's state and each cluster's phase,
// as "key=value" in order, so that a test sees states that last one frame.
const recorderJS = `(() => {
	const seen = window.__seen = [], last = {};
	const note = (k, v) => { if (last[k] !== v) { last[k] = v; seen.push(k + '=' + v); } };
	const scan = () => {
		for (const c of document.querySelectorAll('.card')) {
			if (c.dataset.state) note('card' + c.dataset.cluster, c.dataset.state + '/g' + c.dataset.generation);
		}
		const d = document.getElementById('deploy');
		if (!d.hidden && d.dataset.state) note('deploy', d.dataset.state);
		for (const r of document.querySelectorAll('.dep-row')) note('phase' + r.dataset.cluster, r.dataset.phase);
	};
	new MutationObserver(scan).observe(document.body, {subtree: true, childList: true, attributes: true});
	scan();
	return true;
})()`

// browser is a headless Chromium tab.
type browser struct {
	t       *testing.T
	ctx     context.Context
	mu      sync.Mutex
	console []chromedp.ConsoleMessage
}

func newBrowser(t *testing.T, exe string) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	b := &browser{t: t, ctx: ctx}
	// The first Run starts the browser; it lives as long as ctx.
	if err := chromedp.Do(ctx); err != nil {
		cancelTab()
		cancelAlloc()
		t.Fatalf("start chromium: %v", err)
	}
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.console = append(b.console, m)
			b.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser to exit
		<-consoleDone
	})
	return b
}

func (b *browser) run(action chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, action); err != nil {
		b.t.Fatalf("chromium: %v", err)
	}
}

// eval evaluates expr in the page and decodes its value into out (if non-nil).
func (b *browser) eval(expr string, out any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](expr))
	if err != nil {
		b.t.Fatalf("evaluate %.80q: %v", expr, err)
	}
	if out != nil {
		if err := jsonUnmarshal(raw, out); err != nil {
			b.t.Fatalf("evaluate %.80q: result %s: %v", expr, raw, err)
		}
	}
}

// waitJS polls expr until it is true.
func (b *browser) waitJS(what string, timeout time.Duration, expr string) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var ok bool
		b.eval(expr, &ok)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			var seen any
			b.eval(`window.__seen`, &seen)
			b.screenshot("statusws-page-failed.png")
			b.t.Fatalf("page: timed out after %v waiting for %s (states drawn: %v)", timeout, what, seen)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (b *browser) cardText(id int) string {
	b.t.Helper()
	var s string
	b.eval(fmt.Sprintf(`document.querySelector('.card[data-cluster="%d"]').innerText`, id), &s)
	return s
}

// screenshot saves the whole page as a PNG artifact.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("SM_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", ".artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	abs, _ := filepath.Abs(path)
	b.t.Logf("screenshot: %s", abs)
}

// checkConsole fails the test on any script exception or security error (a
// Content-Security-Policy violation) the page caused. Failed WebSocket
// connections while the manager was down are expected.
func (b *browser) checkConsole() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.console {
		switch {
		case m.IsException(), m.Source == "security", strings.Contains(m.Text, "Content Security Policy"):
			b.t.Errorf("page console: %s (%s:%d)", m, m.URL, m.Line)
		default:
			b.t.Logf("page console: %s", m)
		}
	}
}

// chromium returns the browser to drive, installing Debian's chromium package
// first when it is missing and this process may (root, with apt-get); it skips
// the test only when it is missing and cannot be installed.
func chromium(t *testing.T) string {
	t.Helper()
	chromiumOnce.Do(func() { chromiumPath, chromiumErr = findOrInstallChromium() })
	if errors.Is(chromiumErr, errCannotInstall) {
		t.Skipf("chromium is not installed and cannot be installed here (%v): run `apt-get install chromium` as root, or scripts/test.sh as root", chromiumErr)
	}
	if chromiumErr != nil {
		t.Fatal(chromiumErr)
	}
	return chromiumPath
}

var (
	chromiumOnce     sync.Once
	chromiumPath     string
	chromiumErr      error
	errCannotInstall = errors.New("not root, or no apt-get")
)

func findChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

func findOrInstallChromium() (string, error) {
	if p := findChromium(); p != "" {
		return p, nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil || os.Geteuid() != 0 {
		return "", errCannotInstall
	}
	fmt.Fprintln(os.Stderr, "statusws: chromium is missing; installing Debian's package (as scripts/test.sh does)")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "chromium"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get %s: %v\n%s", strings.Join(args, " "), err, lastLines(out, 20))
		}
	}
	if p := findChromium(); p != "" {
		return p, nil
	}
	return "", errors.New("apt-get installed chromium but it is not on $PATH")
}

func lastLines(b []byte, n int) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return bytes.Join(lines, []byte("\n"))
}

// deploy sends DEPLOY over the manager's socket as a client and returns the
// reply's payload.
func deploy(t *testing.T, socket string) []byte {
	t.Helper()
	c := testenv.Dial(t, socket, "statusws-test")
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpDeploy})
	if err != nil {
		t.Fatalf("DEPLOY: %v", err)
	}
	if r.Error != nil {
		t.Fatalf("DEPLOY refused: %+v", r.Error)
	}
	return r.Payload
}

// A recycle shows on its cluster's card: the flag names the reason while it
// runs and after it succeeded, and carries its state.
func TestPageShowsRecycle(t *testing.T) {
	exe := chromium(t)
	cfg := testConfig(t)
	cfg.Heartbeat.Timeout = dur(3 * time.Second) // Chromium and -race share two cores
	cfg.Recycle.Enabled, cfg.Recycle.MaxRSS = true, 96<<20
	cfg.Recycle.Sustain, cfg.Recycle.Interval = dur(200*time.Millisecond), dur(50*time.Millisecond)
	e := start(t, cfg)
	st := e.WaitReady()

	b := newBrowser(t, exe)
	b.run(chromedp.Navigate(e.url + "/"))
	b.waitJS("4 cards, no recycle flag", 10*time.Second, `(() => {
		const cards = [...document.querySelectorAll('.card')];
		return cards.length === 4 && cards.every(c => c.querySelector('.f-recycle').hidden);
	})()`)
	c := testenv.Dial(t, cfg.Socket, "grow")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Request(ctx, &ipc.Frame{Op: "sim.grow", Target: "2", Payload: []byte(`{"bytes":134217728}`)}); err != nil {
		t.Fatal(err)
	}
	b.waitJS("card 2 recycled for rss", 20*time.Second, `(() => {
		const f = document.querySelector('.card[data-cluster="2"] .f-recycle');
		return !f.hidden && f.dataset.state === 'succeeded' && f.textContent === 'recycled · rss' && f.title.includes('over 96 MiB');
	})()`)
	newPID := e.WaitReady().Clusters[2].PID
	if newPID == st.Clusters[2].PID {
		t.Fatal("the page says recycled but the pid did not change")
	}
	b.waitJS("card 2's new pid", 5*time.Second, fmt.Sprintf(`document.querySelector('.card[data-cluster="2"]').textContent.includes('pid %d')`, newPID))
	b.screenshot("statusws-page-recycle.png")
	b.checkConsole()
}
