package statusws_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sm-supervisor/sm/internal/testenv"
)

// The page's pictures in a real headless Chromium against a real manager:
// every cluster's memory and heartbeat-latency charts are drawn from the
// heartbeats and move as new ones arrive, and the deploy bar follows a real
// deploy through values between 0 and 100%.
func TestPageChartsInChromium(t *testing.T) {
	exe := chromium(t)
	cfg := testConfig(t)
	cfg.Heartbeat.Interval = dur(100 * time.Millisecond)
	cfg.Heartbeat.Timeout = dur(3 * time.Second) // Chromium and -race share two cores
	testenv.WriteConfig(t, cfg)
	e := start(t, cfg)
	e.WaitReady()

	b := newBrowser(t, exe)
	b.run(chromedp.Navigate(e.url + "/"))
	b.eval(progressRecorderJS, nil)

	// Both charts on every card, each a polyline of samples.
	b.waitJS("every card charts memory and ping", 10*time.Second, `(() => {
		const cards = [...document.querySelectorAll('.card')];
		return cards.length === 4 && cards.every(c => ['memory', 'ping'].every(m => {
			const w = c.querySelector('.chart[data-metric="' + m + '"]');
			return w && !w.hidden && +w.dataset.points >= 2 &&
				w.querySelector('svg polyline').getAttribute('points').split(' ').length >= 2;
		}));
	})()`)
	type chart struct {
		Points int     `json:"points"`
		Line   string  `json:"line"`
		Last   float64 `json:"last"`
		Text   string  `json:"text"`
	}
	read := func(cluster int, metric string) chart {
		var c chart
		b.eval(fmt.Sprintf(`(() => {
			const w = document.querySelector('.card[data-cluster="%d"] .chart[data-metric="%s"]');
			return {points: +w.dataset.points, line: w.querySelector('polyline').getAttribute('points'),
				last: +w.dataset.last, text: w.querySelector('.chart-value').textContent};
		})()`, cluster, metric), &c)
		return c
	}
	mem0 := read(0, "memory")
	ping0 := read(0, "ping")
	t.Logf("cluster 0 at first: memory %+v, ping %+v", mem0, ping0)

	// The values are the heartbeats': the simulated bot's pings are 35..59
	// ms, its memory_bytes the order of what the manager last heard.
	if ping0.Last < 35 || ping0.Last > 59 || ping0.Text != fmt.Sprintf("%d ms", int(ping0.Last)) {
		t.Errorf("ping chart of cluster 0: %+v, want 35..59 ms", ping0)
	}
	var beat struct {
		MemoryBytes float64 `json:"memory_bytes"`
	}
	if err := json.Unmarshal(e.MustStatus().Clusters[0].Heartbeat, &beat); err != nil || beat.MemoryBytes <= 0 {
		t.Fatalf("cluster 0's heartbeat: %v %+v", err, beat)
	}
	if mem0.Last < beat.MemoryBytes/2 || mem0.Last > beat.MemoryBytes*2 {
		t.Errorf("memory chart of cluster 0 ends at %v, the manager's last heartbeat says %v", mem0.Last, beat.MemoryBytes)
	}

	// New heartbeats move the charts: more samples, a new line, and the
	// simulated ping, which drifts every second, drawn at several heights.
	b.waitJS("cluster 0's charts take new samples", 10*time.Second, fmt.Sprintf(`(() => {
		const w = document.querySelector('.card[data-cluster="0"] .chart[data-metric="ping"]');
		const ys = new Set(w.querySelector('polyline').getAttribute('points').split(' ').map(p => p.split(',')[1]));
		return +w.dataset.points >= %d + 2 && ys.size >= 3;
	})()`, ping0.Points))
	if m := read(0, "memory"); m.Points <= mem0.Points || m.Line == mem0.Line {
		t.Errorf("memory chart of cluster 0 did not move: %+v, then %+v", mem0, m)
	}
	b.screenshot("statusws-page-charts.png")

	// A real deploy, one cluster at a time: the bar passes through values
	// between 0 and 100, and ends full.
	next := *cfg
	next.Cluster.Command = append(append([]string(nil), cfg.Cluster.Command...), "--connect-delay=300ms")
	testenv.WriteConfig(t, &next)
	deploy(t, cfg.Socket)
	b.waitJS("the deploy bar part way", 15*time.Second, `window.__progress.some(p => p.state === 'running' && p.pct > 0 && p.pct < 100)`)
	b.screenshot("statusws-page-deploy-bar.png")
	b.waitJS("the deploy bar full", 20*time.Second, `(() => {
		const d = document.getElementById('deploy'), bar = d.querySelector('.dep-bar');
		return d.dataset.state === 'succeeded' && d.dataset.progress === '100' &&
			bar.getAttribute('aria-valuenow') === '100' && bar.querySelector('.dep-fill').style.width === '100%';
	})()`)
	var progress []struct {
		State string `json:"state"`
		Pct   int    `json:"pct"`
	}
	b.eval(`window.__progress`, &progress)
	t.Logf("deploy bar values drawn: %v", progress)
	distinct := map[int]bool{}
	for i, p := range progress {
		distinct[p.Pct] = true
		if i > 0 && p.Pct < progress[i-1].Pct {
			t.Errorf("the deploy bar went back: %v", progress)
			break
		}
	}
	if len(distinct) < 4 {
		t.Errorf("the deploy bar took %d values (%v): want it to move through the deploy, not jump", len(distinct), progress)
	}
	// The charts go on across the deploy, for the new generation's processes.
	b.waitJS("charts after the deploy", 10*time.Second, `[...document.querySelectorAll('.card')].every(c =>
		c.dataset.generation === '2' && +c.querySelector('.chart[data-metric="memory"]').dataset.points >= 2)`)
	b.checkConsole()
}

// progressRecorderJS keeps, in window.__progress, every value the deploy bar
// has shown, with the deploy's state, in order.
const progressRecorderJS = `(() => {
	const seen = window.__progress = [];
	let last = '';
	const scan = () => {
		const d = document.getElementById('deploy');
		const bar = d.querySelector('.dep-bar');
		if (d.hidden || !bar) return;
		const pct = +bar.getAttribute('aria-valuenow'), key = d.dataset.state + '/' + pct;
		if (key !== last && String(pct) === d.dataset.progress) { last = key; seen.push({state: d.dataset.state, pct: pct}); }
	};
	new MutationObserver(scan).observe(document.body, {subtree: true, childList: true, attributes: true});
	scan();
	return true;
})()`
