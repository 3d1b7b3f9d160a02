package statusws_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/manager"
)

// TestPageHostsInChromium: with [mesh], the page in a real headless Chromium
// shows the hosts (each with its capacity and clusters) and on every card
// the host running it, for two real managers sharing four clusters through
// a real nats-server; when one host leaves, the page follows the hosts
// event and the cards' new holder.
func TestPageHostsInChromium(t *testing.T) {
	exe := chromium(t)
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	cfgA, cfgB := testConfig(t), testConfig(t)
	cfgA.Mesh.NATSURL, cfgA.Mesh.HostID, cfgA.Mesh.MaxClusters = srv.URL, "host-a", 4
	cfgB.Mesh.NATSURL, cfgB.Mesh.HostID, cfgB.Mesh.MaxClusters = srv.URL, "host-b", 2
	cfgA.Mesh.Lease, cfgB.Mesh.Lease = dur(2*time.Second), dur(2*time.Second)
	cfgA.Heartbeat.Timeout, cfgB.Heartbeat.Timeout = dur(3*time.Second), dur(3*time.Second) // Chromium and -race share two cores
	e := start(t, cfgA)
	b := testenv.StartManager(t, manager.Options{Config: cfgB, Logger: testenv.Logger(t, slog.LevelInfo).With("c", "manager-b")})

	br := newBrowser(t, exe)
	br.run(chromedp.Navigate(e.url + "/"))
	// Placement puts clusters 0 and 2 on host-a, 1 and 3 on host-b (the
	// fewest first, the lowest id among equals).
	br.waitJS("two hosts of two clusters, every card naming its host", 30*time.Second, `(() => {
		const sec = document.getElementById('hosts'), rows = [...sec.querySelectorAll('.host-row')];
		if (sec.hidden || rows.length !== 2) return false;
		const by = {};
		for (const r of rows) for (const c of r.dataset.clusters.split(',').filter(x => x !== '')) by[c] = r.dataset.host;
		const cards = [...document.querySelectorAll('.card')];
		return rows[0].dataset.host === 'host-a' && rows[1].dataset.host === 'host-b' &&
			rows[0].dataset.capacity === '4' && rows[1].dataset.capacity === '2' &&
			rows[0].dataset.clusters.split(',').length === 2 && rows[1].dataset.clusters.split(',').length === 2 &&
			cards.length === 4 && cards.every(c => by[c.dataset.cluster] === c.dataset.host);
	})()`)
	var text string
	br.eval(`document.getElementById('hosts').innerText`, &text)
	t.Logf("hosts panel:\n%s", text)
	for _, want := range []string{"host-a (this host)", "host-b", "2 / 4 clusters", "2 / 2 clusters", "2 hosts · 4 clusters held"} {
		if !strings.Contains(text, want) {
			t.Fatalf("hosts panel %q does not say %q", text, want)
		}
	}
	var tag string
	br.eval(`document.querySelector('.card[data-cluster="1"] .host-tag').textContent`, &tag)
	if tag != "@host-b" {
		t.Fatalf("card 1's host tag %q, want @host-b", tag)
	}
	// host-a's page shows host-b's clusters as elsewhere, not as its own state.
	br.waitJS("cards 1 and 3 elsewhere, 0 and 2 ready here", 20*time.Second, `(() => {
		const card = id => document.querySelector('.card[data-cluster="' + id + '"]');
		return card(1).dataset.remote === 'true' && card(3).dataset.remote === 'true' &&
			card(1).innerText.includes('runs on host host-b') &&
			card(0).dataset.remote === 'false' && card(0).dataset.state === 'ready' &&
			card(2).dataset.remote === 'false' && card(2).dataset.state === 'ready';
	})()`)
	br.screenshot("statusws-page-hosts.png")

	// host-b leaves: host-a takes its clusters; the page follows.
	b.Stop()
	br.waitJS("host-a alone with 4 clusters, every card on it", 30*time.Second, `(() => {
		const rows = [...document.querySelectorAll('#hosts .host-row')];
		const cards = [...document.querySelectorAll('.card')];
		return rows.length === 1 && rows[0].dataset.host === 'host-a' && rows[0].dataset.clusters === '0,1,2,3' &&
			cards.length === 4 && cards.every(c => c.dataset.host === 'host-a' && c.dataset.state === 'ready' && c.dataset.remote === 'false');
	})()`)
	br.checkConsole()
}
