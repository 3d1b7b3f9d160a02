// sm status page: renders sm-manager's state feed (the WebSocket at ./ws).
//
// The feed's data is untrusted (heartbeat payloads are whatever a bot sends):
// it reaches the DOM only as textContent, as a title, or mapped onto one of a
// fixed set of class names; the page never parses feed data as HTML.
'use strict';

(function () {
  const BACKOFF_MIN_MS = 500;
  const BACKOFF_MAX_MS = 15000;
  const PEER_TTL_MIN_MS = 1500; // a deploy peer silent for 3 heartbeats (at least this) is gone
  const DEPLOY_ROWS_MS = 60000; // a successful deploy's per-cluster rows stay this long
  const TICK_MS = 250;
  // Deploy steps of a cluster, in order, with the timestamp that marks each.
  const STEPS = [
    ['spawned', 'spawned_at'], ['ready', 'ready_at'], ['routed', 'routed_at'],
    ['quiescing', 'quiesce_sent_at'], ['quiesced', 'quiesced_at'],
    ['old exited', 'exited_at'], ['activated', 'activated_at'],
  ];

  // ---------------------------------------------------------------- helpers

  function $(id) { return document.getElementById(id); }

  function h(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function setText(e, text) {
    text = String(text);
    if (e.textContent !== text) e.textContent = text;
  }

  function setClass(e, base, variant) {
    const cls = variant ? base + ' ' + variant : base;
    if (e.className !== cls) e.className = cls;
  }

  function show(e, on) { e.hidden = !on; }

  function isNum(v) { return typeof v === 'number' && Number.isFinite(v); }
  function isInt(v) { return Number.isInteger(v); }
  function isObj(v) { return v !== null && typeof v === 'object' && !Array.isArray(v); }

  // clip keeps a bot-supplied string short enough for a cell's tooltip.
  function clip(s, n) {
    s = String(s);
    return s.length > n ? s.slice(0, n - 1) + '…' : s;
  }

  const nf = new Intl.NumberFormat('en');

  function fmtAge(ms) {
    if (!isNum(ms) || ms < 0) return '—';
    if (ms < 10000) return (ms / 1000).toFixed(1) + 's';
    if (ms < 60000) return Math.floor(ms / 1000) + 's';
    if (ms < 3600000) return Math.floor(ms / 60000) + 'm ' + Math.floor((ms % 60000) / 1000) + 's';
    if (ms < 86400000) return Math.floor(ms / 3600000) + 'h ' + Math.floor((ms % 3600000) / 60000) + 'm';
    return Math.floor(ms / 86400000) + 'd';
  }

  function fmtBytes(b) {
    if (!isNum(b) || b < 0) return '';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b : b.toFixed(b < 10 ? 1 : 0)) + ' ' + units[i];
  }

  function parseTime(s) {
    if (typeof s !== 'string') return 0;
    const t = Date.parse(s);
    return Number.isNaN(t) ? 0 : t;
  }

  function clockTime(ms) {
    return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  }

  // Colour classes: s-ready, s-connecting, s-quiescing, s-restarting, s-down, s-unknown.

  function clusterClass(state) {
    switch (state) {
      case 'ready': return 'ready';
      case 'starting': case 'registered': return 'connecting';
      case 'quiescing': case 'stopping': return 'quiescing';
      case 'restarting': return 'restarting';
      case 'crash_loop': case 'exited': return 'down';
      default: return 'unknown';
    }
  }

  // shardClass maps a bot's own shard status onto a colour. Bots name their
  // statuses as their gateway library does; anything unrecognised is unknown.
  function shardClass(status) {
    if (typeof status !== 'string') return 'unknown';
    const s = status.toLowerCase();
    if (/^(ready|connected|online|resumed|active)$/.test(s)) return 'ready';
    if (/^(connecting|identifying|resuming|reconnecting|waiting|nearly|starting|handshak|unavailable)/.test(s)) return 'connecting';
    if (/^(disconnected|dead|closed|zombie|failed|error|offline|invalid)/.test(s)) return 'down';
    return 'unknown';
  }

  // ------------------------------------------------------------------ model

  const model = {
    status: null, // the last snapshot/topology (topology, generation)
    clusters: [], // by cluster id
    deploy: null,
    discord: null, // the identify gate and session-start budget, if reported
    hosts: null, // with [mesh]: the hosts, and when they were reported (hostsAt)
    hostsAt: 0,
    skew: 0, // client clock minus the manager's, from the snapshot's "at"
    lastMsg: 0,
  };

  // A cluster as the page knows it: the manager's ClusterStatus (info), the
  // newest heartbeat of its routed process (beat), and heartbeats of any other
  // process of the cluster (peers, by pid: a deploy's new or old generation).
  function newCluster(info, now) {
    const c = {
      id: info.id, info: info, beat: null, lastBeat: 0, interval: 0,
      restartAt: 0, peers: new Map(), view: null, dirty: true,
    };
    if (isInt(info.pid) && info.pid > 0 && isNum(info.heartbeat_age_ms) && info.heartbeat_age_ms >= 0) {
      c.lastBeat = now - info.heartbeat_age_ms;
      if (info.heartbeat !== undefined) {
        c.beat = { pid: info.pid, gen: info.generation, payload: info.heartbeat, at: c.lastBeat };
        recordSample(info.id, info.heartbeat, c.lastBeat);
      }
    }
    if (isNum(info.restart_in_ms) && info.restart_in_ms > 0) c.restartAt = now + info.restart_in_ms;
    return c;
  }

  function applyStatus(st, now) {
    if (!isObj(st) || !Array.isArray(st.clusters)) return;
    model.status = st;
    model.deploy = isObj(st.deploy) ? st.deploy : null;
    model.discord = isObj(st.discord) ? st.discord : null;
    applyHosts(st.hosts, now);
    const at = parseTime(st.at);
    if (at) model.skew = now - at;
    model.clusters = [];
    for (const info of st.clusters) {
      if (isObj(info) && isInt(info.id) && info.id >= 0 && info.id < 100000) {
        model.clusters[info.id] = newCluster(info, now);
      }
    }
    rebuildGrid();
    deployDirty = true;
    schedule();
  }

  function applyCluster(cs, now) {
    if (!isObj(cs) || !isInt(cs.id) || cs.id < 0 || cs.id >= 100000) return;
    let c = model.clusters[cs.id];
    if (!c) {
      model.clusters[cs.id] = newCluster(cs, now);
      rebuildGrid();
      schedule();
      return;
    }
    if (cs.pid !== c.info.pid) {
      // The routed process changed (a deploy switched, or a respawn). The new
      // one's beats so far were a peer's; the old one, if it still runs (a
      // deploy's quiescing generation), shows up as a peer by its next beat.
      const p = c.peers.get(cs.pid);
      c.beat = p || null;
      c.peers.delete(cs.pid);
      c.lastBeat = p ? p.at : 0;
    }
    if (isInt(cs.pid) && cs.pid > 0 && isNum(cs.heartbeat_age_ms) && cs.heartbeat_age_ms >= 0) {
      c.lastBeat = Math.max(c.lastBeat, now - cs.heartbeat_age_ms);
    }
    c.restartAt = isNum(cs.restart_in_ms) && cs.restart_in_ms > 0 ? now + cs.restart_in_ms : 0;
    c.info = cs;
    markDirty(c);
  }

  function applyBeat(ev, now) {
    if (!isInt(ev.cluster)) return;
    const c = model.clusters[ev.cluster];
    if (!c) return;
    const b = { pid: ev.pid, gen: ev.generation, ready: ev.ready === true, payload: ev.payload, at: now };
    if (ev.pid === c.info.pid) {
      if (c.beat && c.beat.pid === ev.pid && c.lastBeat > 0) {
        const gap = now - c.lastBeat;
        if (gap > 0 && gap < 120000) c.interval = c.interval ? c.interval * 0.8 + gap * 0.2 : gap;
      }
      c.beat = b;
      c.lastBeat = now;
      recordSample(c.id, ev.payload, now);
    } else {
      c.peers.set(ev.pid, b);
    }
    markDirty(c);
  }

  // applyHosts keeps the mesh's hosts (a STATUS's or a hosts event's list):
  // each id, capacity, clusters and lease age; none on a single host.
  function applyHosts(list, now) {
    model.hosts = Array.isArray(list) ? list.filter(function (x) { return isObj(x) && typeof x.id === 'string'; }) : null;
    if (model.hosts && model.hosts.length === 0) model.hosts = null;
    model.hostsAt = now;
    hostsDirty = true;
    for (const c of model.clusters) if (c) c.dirty = true;
    schedule();
  }

  function applyDeploy(d) {
    if (!isObj(d)) return;
    model.deploy = d;
    if (model.status && isInt(d.generation) && d.generation > model.status.generation) {
      model.status.generation = d.generation;
    }
    // An old process confirmed gone is no peer any more, whatever its last beat.
    if (Array.isArray(d.clusters)) {
      for (const e of d.clusters) {
        const c = isObj(e) && isInt(e.cluster) ? model.clusters[e.cluster] : null;
        if (!c || !parseTime(e.exited_at)) continue;
        for (const [pid, b] of c.peers) {
          if (b.gen < d.generation) { c.peers.delete(pid); markDirty(c); }
        }
      }
    }

    deployDirty = true;
    schedule();
  }

  function onMessage(data, now) {
    let ev;
    try { ev = JSON.parse(data); } catch (e) { return; }
    if (!isObj(ev)) return;
    model.lastMsg = now;
    switch (ev.type) {
      case 'snapshot':
        applyStatus(ev.status, now);
        connected();
        break;
      case 'topology':
        applyStatus(ev.status, now);
        break;
      case 'cluster':
        applyCluster(ev.cluster, now);
        break;
      case 'heartbeat':
        applyBeat(ev, now);
        break;
      case 'deploy':
        applyDeploy(ev.deploy);
        break;
      case 'discord':
        if (isObj(ev.discord)) { model.discord = ev.discord; schedule(); }
        break;
      case 'hosts':
        applyHosts(ev.hosts, now);
        break;
    }
  }

  // ---------------------------------------------------- payload (untrusted)

  // shardsOf reads the bot's per-shard statuses from a heartbeat payload, if
  // it has them as {"shards":[{"id":n,"status":"..."}]}: a Map of shard id to
  // {cls, title}. Entries without an id are taken in order from first.
  function shardsOf(payload, first, last) {
    if (!isObj(payload) || !Array.isArray(payload.shards)) return null;
    const out = new Map();
    payload.shards.forEach(function (s, i) {
      if (!isObj(s)) return;
      const id = isInt(s.id) ? s.id : first + i;
      if (id < first || id > last) return;
      const parts = ['shard ' + id];
      if (s.status !== undefined) parts.push(clip(s.status, 24));
      const ping = isNum(s.ping_ms) ? s.ping_ms : isNum(s.ping) ? s.ping : undefined;
      if (ping !== undefined && ping >= 0) parts.push(Math.round(ping) + ' ms');
      if (isNum(s.guilds)) parts.push(nf.format(s.guilds) + ' guilds');
      out.set(id, { cls: shardClass(s.status), title: parts.join(' · '), status: s.status });
    });
    return out;
  }

  // statsOf picks the fields a status page can show from a payload, if present.
  function statsOf(payload) {
    const out = {};
    if (!isObj(payload)) return out;
    const shards = Array.isArray(payload.shards) ? payload.shards.filter(isObj) : [];
    if (isNum(payload.guilds)) out.guilds = payload.guilds;
    else if (shards.some(function (s) { return isNum(s.guilds); })) {
      out.guilds = shards.reduce(function (a, s) { return a + (isNum(s.guilds) ? s.guilds : 0); }, 0);
    }
    if (isNum(payload.memory_bytes)) out.memory = payload.memory_bytes;
    const ping = isNum(payload.ping) ? payload.ping : isNum(payload.ping_ms) ? payload.ping_ms : undefined;
    if (ping !== undefined && ping >= 0) out.ping = ping;
    else {
      const pings = shards.map(function (s) { return isNum(s.ping_ms) ? s.ping_ms : s.ping; })
        .filter(function (p) { return isNum(p) && p >= 0; });
      if (pings.length) out.ping = pings.reduce(function (a, b) { return a + b; }, 0) / pings.length;
    }
    if (isNum(payload.uptime_ms) && payload.uptime_ms >= 0) out.uptime = payload.uptime_ms;
    return out;
  }

  // ------------------------------------------------------------------- view

  let deployDirty = false;
  let hostsDirty = false;
  let scheduled = false;

  function markDirty(c) {
    c.dirty = true;
    schedule();
  }

  function schedule() {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(function () {
      scheduled = false;
      render();
    });
  }

  function render() {
    const now = Date.now();
    for (const c of model.clusters) {
      if (c && c.dirty) {
        c.dirty = false;
        renderCard(c, now);
      }
    }
    if (deployDirty) {
      deployDirty = false;
      renderDeploy(now);
    }
    if (hostsDirty) {
      hostsDirty = false;
      renderHosts();
    }
    renderSummary();
  }

  function rebuildGrid() {
    const grid = $('grid');
    const cards = [];
    for (const c of model.clusters) {
      if (!c) continue;
      c.view = buildCard(c);
      c.dirty = true;
      cards.push(c.view.card);
    }
    grid.replaceChildren.apply(grid, cards);
  }

  function buildCard(c) {
    const v = {};
    v.card = h('article', 'card');
    v.card.dataset.cluster = String(c.id);
    const head = h('div', 'card-head');
    v.cid = h('span', 'cid', '#' + c.id);
    v.range = h('span', 'range');
    v.gen = h('span', 'gen');
    v.host = h('span', 'host-tag');
    v.state = h('span', 'badge');
    head.append(v.cid, v.range, h('span', 'grow'), v.host, v.gen);

    // The shard cells, with the cluster's state beside them.
    const row = h('div', 'cells-row');
    v.cells = h('div', 'cells');
    v.cellEls = [];
    row.append(v.cells, v.state);

    const meta = h('div', 'meta');
    v.pid = h('span', 'pid');
    v.age = h('span', 'age');
    v.uptime = h('span', 'uptime');
    meta.append(v.pid, v.age, v.uptime);
    v.stats = h('div', 'stats');

    const flags = h('div', 'flags');
    v.routed = h('span', 'flag', 'routed');
    v.active = h('span', 'flag', 'active');
    v.deploying = h('span', 'flag f-deploy', 'deploying');
    v.restarts = h('span', 'flag f-restarts');
    v.crash = h('span', 'flag f-crash', 'crash loop');
    v.waiting = h('span', 'flag f-waiting');
    v.recycle = h('span', 'flag f-recycle');
    flags.append(v.routed, v.active, v.deploying, v.restarts, v.crash, v.waiting, v.recycle);

    v.note = h('div', 'note');

    v.peers = h('div', 'peers');

    v.charts = buildCharts();

    v.card.append(head, row, meta, v.stats, v.charts.box, flags, v.note, v.peers);
    return v;
  }

  // cellsFor fills container with one cell per shard of [first, last], coloured
  // from the payload's shard statuses when the process is up, else by the
  // cluster's state.
  function fillCells(container, els, first, last, payloadShards, fallback, label) {
    const n = Math.max(0, Math.min(last - first + 1, 4096));
    while (els.length > n) els.pop().remove();
    while (els.length < n) {
      const cell = h('i', 'cell');
      els.push(cell);
      container.append(cell);
    }
    for (let i = 0; i < n; i++) {
      const id = first + i;
      const s = payloadShards && payloadShards.get(id);
      const cls = s ? s.cls : fallback;
      setClass(els[i], 'cell', 's-' + cls);
      els[i].dataset.shard = String(id);
      els[i].dataset.status = cls;
      const title = s ? s.title : 'shard ' + id + ' · ' + label;
      if (els[i].title !== title) els[i].title = title;
    }
  }

  function renderCard(c, now) {
    const v = c.view;
    if (!v) return;
    const info = c.info;
    // A cluster another mesh host runs: this manager has no process of it,
    // and its state here says nothing about it there.
    const remote = isRemote(info);
    const cls = remote ? 'unknown' : clusterClass(info.state);
    setClass(v.card, 'card', 's-' + cls + (info.crash_loop ? ' crash' : '') + (remote ? ' remote' : ''));
    v.card.dataset.state = String(info.state || 'unknown');
    v.card.dataset.generation = String(info.generation);
    const first = isInt(info.shard_first) ? info.shard_first : 0;
    const last = isInt(info.shard_last) ? info.shard_last : first - 1;
    setText(v.range, first === last ? 'shard ' + first : 'shards ' + first + '–' + last);
    setText(v.gen, 'g' + info.generation);
    const host = typeof info.host_id === 'string' ? info.host_id : '';
    setText(v.host, host ? '@' + clip(host, 32) : '');
    v.host.title = host ? 'runs on host ' + host : '';
    v.card.dataset.host = host;
    show(v.host, host !== '');
    v.card.dataset.remote = remote ? 'true' : 'false';
    setText(v.state, remote ? 'elsewhere' : String(info.state || 'unknown').replace('_', ' '));
    setClass(v.state, 'badge', 's-' + cls);

    const live = isInt(info.pid) && info.pid > 0 && (cls === 'ready' || cls === 'connecting' || cls === 'quiescing');
    const beat = live && c.beat && c.beat.pid === info.pid ? c.beat : null;
    // A process that is up but not stopping: its own shard statuses are the
    // truth. Otherwise the cluster's state colours every shard.
    const payloadShards = beat && cls !== 'quiescing' ? shardsOf(beat.payload, first, last) : null;
    fillCells(v.cells, v.cellEls, first, last, payloadShards, cls, String(info.state));

    setText(v.pid, live ? 'pid ' + info.pid : 'no process');
    const st = beat ? statsOf(beat.payload) : {};
    const parts = [];
    if (st.guilds !== undefined) parts.push(nf.format(st.guilds) + ' guilds');
    if (st.memory !== undefined) parts.push(fmtBytes(st.memory));
    if (st.ping !== undefined) parts.push(Math.round(st.ping) + ' ms ping');
    setText(v.stats, parts.join(' · '));
    show(v.stats, parts.length > 0);
    setText(v.uptime, st.uptime !== undefined ? 'up ' + fmtAge(st.uptime) : '');
    c.guilds = st.guilds;
    c.readyShards = 0;
    for (const e of v.cellEls) if (e.dataset.status === 'ready') c.readyShards++;
    c.shardCount = v.cellEls.length;

    v.routed.classList.toggle('on', !!info.routed);
    v.active.classList.toggle('on', !!info.activated);
    show(v.deploying, !!info.deploying && !(info.recycle && info.recycle.recycling)); // a recycle says so itself
    show(v.restarts, info.restarts > 0);
    setText(v.restarts, '↻ ' + info.restarts);
    v.restarts.title = info.restarts + ' restart' + (info.restarts === 1 ? '' : 's') + ' (counted since the manager started)';
    show(v.crash, !!info.crash_loop && info.state !== 'crash_loop'); // else the state says it
    show(v.waiting, info.waiting > 0);
    setText(v.waiting, info.waiting + ' queued');
    renderRecycle(v, info.recycle);

    renderPeers(c, now);
    renderCharts(c, now);
    tickCard(c, now);
  }

  // renderRecycle shows the cluster's recycling (STATUS's "recycle"): one
  // in progress, the last one's reason, or why a due one waits.
  function renderRecycle(v, r) {
    const on = !!r && typeof r === 'object';
    show(v.recycle, on);
    if (!on) return;
    const reason = String(r.reason || '');
    let text, state;
    if (r.recycling) { text = 'recycling · ' + reason; state = 'running'; }
    else if (r.held) { text = 'recycle held'; state = 'held'; }
    else { text = (r.state === 'succeeded' ? 'recycled · ' : 'recycle ' + String(r.state || '') + ' · ') + reason; state = String(r.state || ''); }
    setText(v.recycle, text);
    v.recycle.dataset.state = state;
    const when = r.finished || r.started;
    const title = r.held ? r.held + (r.held_detail ? ' (' + r.held_detail + ')' : '')
      : String(r.detail || '') + (when ? ' · ' + new Date(when).toLocaleTimeString() : '');
    if (v.recycle.title !== title) v.recycle.title = title;
  }

  function renderPeers(c, now) {
    const v = c.view;
    const rows = [];
    for (const [pid, b] of c.peers) {
      if (now - b.at > peerTTL(c)) { c.peers.delete(pid); continue; }
      const row = h('div', 'peer');
      const which = b.gen > c.info.generation ? 'new' : b.gen < c.info.generation ? 'old' : 'other';
      row.dataset.peer = which;
      row.append(h('span', 'peer-label', which + ' g' + b.gen), h('span', 'peer-pid', 'pid ' + b.pid));
      const cells = h('span', 'cells mini');
      const first = c.info.shard_first, last = c.info.shard_last;
      const fallback = b.ready ? 'ready' : 'connecting';
      fillCells(cells, [], first, last, shardsOf(b.payload, first, last), fallback, b.ready ? 'ready' : 'not ready');
      row.append(cells, h('span', 'peer-ready', b.ready ? 'ready' : 'not ready'));
      rows.push(row);
    }
    v.peers.replaceChildren.apply(v.peers, rows);
  }

  function peerTTL(c) { return Math.max(PEER_TTL_MIN_MS, 3 * (c.interval || 0)); }

  // tickCard updates what changes with time alone: heartbeat age, countdowns.
  function tickCard(c, now) {
    const v = c.view;
    if (!v) return;
    const info = c.info;
    const live = isInt(info.pid) && info.pid > 0 && info.state !== 'restarting' && info.state !== 'crash_loop';
    if (live && c.lastBeat > 0) {
      const age = now - c.lastBeat;
      setText(v.age, 'hb ' + fmtAge(age));
      const iv = Math.max(c.interval || 1000, 250);
      setClass(v.age, 'age', age > iv * 8 ? 'late' : age > iv * 3 ? 'slow' : '');
    } else {
      setText(v.age, live ? 'hb —' : '');
      setClass(v.age, 'age', '');
    }
    let note = '';
    if (isRemote(info)) {
      note = 'runs on host ' + clip(info.host_id, 32);
    } else if (info.state === 'restarting' || info.state === 'crash_loop') {
      if (c.restartAt > now) note = 'restart in ' + fmtAge(c.restartAt - now);
      else if (info.state === 'restarting') note = 'restarting…';
      if (info.last_exit) note = (note ? note + ' · ' : '') + 'last exit: ' + clip(info.last_exit, 80);
    }
    setText(v.note, note);
    show(v.note, note !== '');
    if (c.peers.size) {
      for (const b of c.peers.values()) {
        if (now - b.at > peerTTL(c)) { markDirty(c); break; }
      }
    }
  }

  function pill(label, value, cls) {
    const p = h('div', 'pill' + (cls ? ' ' + cls : ''));
    p.append(h('span', 'pill-label', label), h('span', 'pill-value', value));
    return p;
  }

  let lastSummaryKey = '';

  function renderSummary() {
    const st = model.status;
    if (!st) return;
    let clusters = 0, ready = 0, shards = 0, shardsReady = 0, guilds = 0, haveGuilds = false, crash = 0, down = 0;
    for (const c of model.clusters) {
      if (!c) continue;
      clusters++;
      if (c.info.state === 'ready') ready++;
      if (c.info.crash_loop) crash++;
      if (c.info.state === 'restarting' || c.info.state === 'crash_loop') down++;
      shards += c.shardCount || 0;
      shardsReady += c.readyShards || 0;
      if (c.guilds !== undefined) { guilds += c.guilds; haveGuilds = true; }
    }
    const topo = isObj(st.topology) ? st.topology : {};
    const disc = isObj(model.discord) ? model.discord : {};
    const budget = isObj(disc.budget) ? disc.budget : {};
    const waiting = isInt(disc.identify_waiting) ? disc.identify_waiting : 0;
    const key = [clusters, ready, shards, shardsReady, guilds, haveGuilds, crash, down, st.generation,
      waiting, budget.known, budget.remaining, budget.total, budget.blocking, budget.exhausted].join('/');
    if (key === lastSummaryKey) return;
    lastSummaryKey = key;
    const health = crash > 0 ? 'bad' : down > 0 || ready < clusters ? 'warn' : 'good';
    const pills = [
      pill('clusters', ready + '/' + clusters + ' ready', health),
      pill('shards', shardsReady + '/' + shards + ' ready', shardsReady === shards ? 'good' : 'warn'),
    ];
    if (haveGuilds) pills.push(pill('guilds', nf.format(guilds)));
    if (crash > 0) pills.push(pill('crash loop', String(crash), 'bad'));
    if (waiting > 0) pills.push(pill('identify queue', String(waiting), 'warn'));
    if (budget.known === true && isInt(budget.remaining) && isInt(budget.total)) {
      pills.push(pill('session starts', nf.format(budget.remaining) + '/' + nf.format(budget.total),
        budget.exhausted ? 'bad' : budget.blocking ? 'warn' : ''));
    }
    pills.push(pill('generation', 'g' + model.status.generation));
    if (isInt(topo.total_shards)) {
      pills.push(pill('topology', topo.total_shards + ' shards · ' + topo.shards_per_cluster + '/cluster'));
    }
    const s = $('summary');
    s.replaceChildren.apply(s, pills);
    s.dataset.health = health;
    const mark = health === 'good' ? '●' : health === 'warn' ? '▲' : '✖';
    document.title = mark + ' ' + ready + '/' + clusters + ' ready · sm status';
  }

  // ----------------------------------------------------------------- charts

  // Per cluster, the last CHART_WINDOW_MS of two figures its routed process
  // reports in its heartbeats (statsOf): memory and the gateway heartbeat
  // latency (ping). Samples are kept here, in the page, from the heartbeat
  // events as they arrive, at most one per CHART_STEP_MS and CHART_POINTS in
  // all, so the history is bounded whatever the heartbeat rate. They outlive
  // a reconnect (keyed by cluster id), not a reload; a snapshot's last
  // heartbeat of each cluster is the first sample. Drawn as inline SVG
  // polylines: no library, nothing fetched.
  const CHART_WINDOW_MS = 5 * 60 * 1000;
  const CHART_STEP_MS = 1000;
  const CHART_POINTS = CHART_WINDOW_MS / CHART_STEP_MS;
  const CHART_MIN_SPAN_MS = 10 * CHART_STEP_MS; // a young series fills the chart from its first sample
  const CHART_W = 120, CHART_H = 28;
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const CHARTS = [
    { key: 'memory', label: 'mem', fmt: fmtBytes },
    { key: 'ping', label: 'ping', fmt: function (v) { return Math.round(v) + ' ms'; } },
  ];
  const samples = new Map(); // cluster id → [{t, memory, ping}], oldest first

  function recordSample(id, payload, now) {
    const st = statsOf(payload);
    if (st.memory === undefined && isObj(payload) && isNum(payload.heap_bytes)) st.memory = payload.heap_bytes;
    if (st.memory === undefined && st.ping === undefined) return;
    let list = samples.get(id);
    if (!list) { list = []; samples.set(id, list); }
    const s = { t: now, step: Math.floor(now / CHART_STEP_MS), memory: st.memory, ping: st.ping };
    const last = list[list.length - 1];
    if (last && now < last.t) return; // a snapshot's last heartbeat, older than what we drew
    if (last && last.step === s.step) {
      list[list.length - 1] = s; // the same step: its newest value stands for it
    } else {
      list.push(s);
    }
    while (list.length > CHART_POINTS || (list.length && now - list[0].t > CHART_WINDOW_MS)) list.shift();
  }

  function svg(tag, attrs) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }

  function buildCharts() {
    const box = h('div', 'charts');
    const items = CHARTS.map(function (def) {
      const wrap = h('div', 'chart');
      wrap.dataset.metric = def.key;
      const label = h('span', 'chart-label', def.label);
      const value = h('span', 'chart-value');
      const pic = svg('svg', { viewBox: '0 0 ' + CHART_W + ' ' + CHART_H, preserveAspectRatio: 'none', class: 'spark' });
      const area = svg('polygon', { class: 'spark-area', points: '' });
      const line = svg('polyline', { class: 'spark-line', points: '' });
      pic.append(area, line);
      wrap.append(label, pic, value);
      return { def: def, wrap: wrap, value: value, line: line, area: area, pic: pic };
    });
    for (const it of items) box.append(it.wrap);
    box.hidden = true;
    return { box: box, items: items };
  }

  // renderCharts draws cluster c's samples, the newest at the right edge and
  // the oldest (at most CHART_WINDOW_MS back) at the left. Each chart is
  // scaled to its own range, but never to less than a tenth of its top, so
  // that noise does not look like a swing.
  function renderCharts(c, now) {
    const v = c.view && c.view.charts;
    if (!v) return;
    const list = samples.get(c.id) || [];
    // At most one drawing a step per card unless a step began: a cluster
    // heartbeating ten times a second costs one polyline a second, not ten.
    const newest = list.length ? list[list.length - 1].step : -1;
    if (v.drawnStep === newest && now - v.drawnAt < CHART_STEP_MS) return;
    v.drawnStep = newest;
    v.drawnAt = now;
    let any = false;
    for (const it of v.items) {
      const key = it.def.key;
      const pts = list.filter(function (s) { return isNum(s[key]); });
      it.wrap.dataset.points = String(pts.length);
      it.wrap.hidden = pts.length === 0;
      if (!pts.length) continue;
      any = true;
      let lo = Infinity, hi = -Infinity;
      for (const s of pts) { lo = Math.min(lo, s[key]); hi = Math.max(hi, s[key]); }
      const span = Math.max(hi - lo, Math.abs(hi) / 10) || 1;
      const width = Math.min(CHART_WINDOW_MS, Math.max(CHART_MIN_SPAN_MS, now - pts[0].t));
      const start = now - width;
      const xy = pts.map(function (s) {
        const x = Math.max(0, (s.t - start) / width * CHART_W);
        const y = CHART_H - 1 - (s[key] - lo) / span * (CHART_H - 2);
        return x.toFixed(1) + ',' + y.toFixed(1);
      });
      if (xy.length === 1) xy.unshift('0,' + xy[0].split(',')[1]); // one sample: a flat line
      const line = xy.join(' ');
      it.line.setAttribute('points', line);
      it.area.setAttribute('points', xy[0].split(',')[0] + ',' + CHART_H + ' ' + line + ' ' +
        xy[xy.length - 1].split(',')[0] + ',' + CHART_H);
      const last = pts[pts.length - 1][key];
      it.wrap.dataset.last = String(last);
      setText(it.value, it.def.fmt(last));
      it.wrap.title = it.def.label + ', last ' + Math.round((now - pts[0].t) / 1000) + 's: ' +
        it.def.fmt(pts.reduce(function (a, s) { return Math.min(a, s[key]); }, Infinity)) + ' – ' + it.def.fmt(hi);
    }
    v.box.hidden = !any;
  }

  // ------------------------------------------------------------------ hosts

  // selfHost is this manager's host id in a mesh, '' on a single host.
  function selfHost() {
    if (!model.hosts) return '';
    for (const x of model.hosts) if (x.self === true) return x.id;
    return '';
  }

  // isRemote: the cluster is held by another host of the mesh.
  function isRemote(info) {
    const me = selfHost();
    return me !== '' && typeof info.host_id === 'string' && info.host_id !== '' && info.host_id !== me;
  }

  // renderHosts draws the mesh's hosts: one row per host with its clusters
  // against its capacity, the cluster ids and its lease age (ticking).
  function renderHosts() {
    const sec = $('hosts');
    const hosts = model.hosts;
    show(sec, !!hosts);
    if (!hosts) { sec.replaceChildren(); return; }
    const head = h('div', 'hosts-head');
    let total = 0;
    for (const x of hosts) total += Array.isArray(x.clusters) ? x.clusters.length : 0;
    head.append(h('span', 'dep-title', 'mesh'), h('span', 'hosts-count',
      hosts.length + ' host' + (hosts.length === 1 ? '' : 's') + ' · ' + total + ' cluster' + (total === 1 ? '' : 's') + ' held'));
    const rows = [head];
    for (const x of hosts) {
      const ids = Array.isArray(x.clusters) ? x.clusters.filter(isInt) : [];
      const cap = isInt(x.capacity) && x.capacity > 0 ? x.capacity : 0;
      const row = h('div', 'host-row' + (x.self === true ? ' self' : ''));
      row.dataset.host = x.id;
      row.dataset.clusters = ids.join(',');
      row.dataset.capacity = String(cap);
      const load = h('span', 'host-load', ids.length + (cap ? ' / ' + cap : '') + ' clusters');
      const bar = h('span', 'host-bar');
      const fill = h('i', 'host-fill');
      fill.style.width = (cap ? Math.min(100, Math.round(100 * ids.length / cap)) : ids.length ? 100 : 0) + '%';
      bar.append(fill);
      // The age as of the report: a renewal alone sends no event, so the
      // page cannot age it on its own (a host gone is a new report).
      const age = h('span', 'host-age', isNum(x.lease_age_ms) ? 'lease renewed ' + fmtAge(x.lease_age_ms) + ' before ' + clockTime(model.hostsAt) : '');
      row.append(h('span', 'host-id', clip(x.id, 64) + (x.self === true ? ' (this host)' : '')), load, bar,
        h('span', 'host-clusters', ids.length ? '#' + ids.join(' #') : 'no clusters'), age);
      rows.push(row);
    }
    sec.replaceChildren.apply(sec, rows);
  }

  // ----------------------------------------------------------------- deploy

  function stepsDone(cs) {
    let n = 0;
    STEPS.forEach(function (s, i) { if (parseTime(cs[s[1]])) n = i + 1; });
    return n;
  }

  function renderDeploy(now) {
    const d = model.deploy;
    const box = $('deploy');
    if (!d) { show(box, false); box.replaceChildren(); return; }
    show(box, true);
    const state = String(d.state || 'unknown');
    const finished = parseTime(d.finished);
    box.dataset.state = state;
    box.dataset.id = String(d.id);
    box.className = 'deploy d-' + (/^(pending|running|succeeded|failed|aborted)$/.test(state) ? state : 'unknown') +
      (finished ? ' done' : '');

    const head = h('div', 'dep-head');
    head.append(h('span', 'dep-title', finished ? 'last deploy' : 'deploy'));
    head.append(h('span', 'dep-id', String(d.id)));
    head.append(h('span', 'dep-gen', '→ g' + d.generation));
    const from = d.from || {}, to = d.to || {};
    if (from.total_shards !== to.total_shards || from.shards_per_cluster !== to.shards_per_cluster) {
      head.append(h('span', 'dep-topo', from.total_shards + '×' + from.shards_per_cluster + ' → ' +
        to.total_shards + '×' + to.shards_per_cluster));
    }
    head.append(h('span', 'badge dep-state', state));
    const clusters = Array.isArray(d.clusters) ? d.clusters.filter(isObj) : [];
    const done = clusters.filter(function (c) { return c.phase === 'activated' || c.phase === 'old_exited'; }).length;
    head.append(h('span', 'dep-count', done + '/' + clusters.length + ' clusters'));
    const time = h('span', 'dep-time');
    head.append(h('span', 'grow'), time);
    deployTime = { el: time, started: parseTime(d.started), finished: finished };

    let progress = 0;
    for (const c of clusters) progress += c.phase === 'activated' ? STEPS.length : stepsDone(c);
    const bar = h('div', 'dep-bar');
    const fill = h('div', 'dep-fill');
    const pct = clusters.length ? Math.round(100 * progress / (clusters.length * STEPS.length)) : 0;
    fill.style.width = pct + '%';
    bar.append(fill);
    bar.title = pct + '%';
    bar.setAttribute('role', 'progressbar');
    bar.setAttribute('aria-valuemin', '0');
    bar.setAttribute('aria-valuemax', '100');
    bar.setAttribute('aria-valuenow', String(pct));
    box.dataset.progress = String(pct);
    head.append(h('span', 'dep-pct', pct + '%'));

    const parts = [head, bar];
    if (d.reason) parts.push(h('div', 'dep-reason', d.reason));

    // Running or failed: every cluster. Finished well: the rows stay a while
    // (every bar full), then the summary line is enough.
    const until = finished && state === 'succeeded' ? finished + model.skew + DEPLOY_ROWS_MS : 0;
    deployRowsUntil = until > now ? until : 0; // tickDeploy redraws without rows then
    if (!finished || state !== 'succeeded' || deployRowsUntil) {
      const rows = h('div', 'dep-rows');
      for (const c of clusters) rows.append(deployRow(c));
      parts.push(rows);
    }
    box.replaceChildren.apply(box, parts);
    tickDeploy(now);
  }

  function deployRow(c) {
    const row = h('div', 'dep-row');
    const phase = String(c.phase || 'pending');
    row.dataset.cluster = String(c.cluster);
    row.dataset.phase = phase;
    const failed = phase === 'failed';
    const n = phase === 'activated' ? STEPS.length : stepsDone(c);
    const steps = h('span', 'steps');
    STEPS.forEach(function (s, i) {
      let cls = 'step';
      if (i < n) cls += ' done';
      else if (i === n && failed) cls += ' failed';
      else if (i === n && phase !== 'skipped' && phase !== 'pending') cls += ' now';
      const e = h('i', cls);
      e.title = s[0];
      steps.append(e);
    });
    const who = [];
    if (c.old && isInt(c.old.generation)) who.push('g' + c.old.generation);
    if (c.new && isInt(c.new.generation)) who.push('g' + c.new.generation);
    row.append(h('span', 'dep-cid', '#' + c.cluster), steps, h('span', 'dep-phase p-' + (failed ? 'failed' : phase === 'activated' ? 'done' : 'other'), phase.replace('_', ' ')),
      h('span', 'dep-who', who.join(' → ')));
    if (c.reason) row.append(h('span', 'dep-row-reason', c.reason));
    return row;
  }

  let deployTime = null;
  let deployRowsUntil = 0;

  function tickDeploy(now) {
    if (deployRowsUntil && now >= deployRowsUntil) {
      deployRowsUntil = 0;
      deployDirty = true;
      schedule();
    }
    if (!deployTime || !deployTime.started) return;
    const end = deployTime.finished || (now - model.skew);
    let text = fmtAge(Math.max(0, end - deployTime.started));
    if (deployTime.finished) text = 'took ' + text + ' · ' + clockTime(deployTime.finished + model.skew);
    setText(deployTime.el, text);
  }

  // ------------------------------------------------------------- connection

  let ws = null;
  let attempt = 0;
  let retryAt = 0;
  let offlineSince = 0;
  let lastClose = '';

  function setConn(state, text) {
    const c = $('conn');
    c.dataset.state = state;
    setText($('conn-text'), text);
    document.body.classList.toggle('offline', state !== 'live');
  }

  function connected() {
    attempt = 0;
    offlineSince = 0;
    setConn('live', 'live');
  }

  function connect() {
    retryAt = 0;
    const url = new URL('ws', location.href);
    url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
    url.hash = '';
    url.search = '';
    if (attempt > 0) setConn('connecting', 'reconnecting…');
    let sock;
    try {
      sock = new WebSocket(url.href);
    } catch (e) {
      scheduleReconnect('cannot open the feed');
      return;
    }
    ws = sock;
    sock.onmessage = function (e) {
      if (ws === sock && typeof e.data === 'string') onMessage(e.data, Date.now());
    };
    sock.onclose = function (e) {
      if (ws !== sock) return;
      ws = null;
      let why = 'feed closed';
      if (e.code === 1008 && e.reason === 'too slow') why = 'dropped: too slow';
      else if (e.code === 1001) why = 'manager stopping';
      else if (e.code === 1006) why = attempt > 0 ? 'unreachable' : 'connection lost';
      scheduleReconnect(why);
    };
  }

  function scheduleReconnect(why) {
    if (!offlineSince) offlineSince = Date.now();
    lastClose = why;
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * Math.pow(2, attempt));
    attempt++;
    retryAt = Date.now() + base * (0.8 + Math.random() * 0.4);
    tickConn(Date.now());
  }

  function tickConn(now) {
    if (retryAt) {
      if (now >= retryAt) { connect(); return; }
      setConn('offline', lastClose + ' · retry in ' + Math.ceil((retryAt - now) / 1000) + 's');
    }
  }

  function tickFooter(now) {
    const u = $('updated');
    if (!model.lastMsg) { setText(u, ''); return; }
    if (offlineSince) setText(u, 'offline since ' + clockTime(offlineSince) + ' · showing the last state');
    else setText(u, 'updated ' + fmtAge(now - model.lastMsg) + ' ago');
  }

  // ------------------------------------------------------------------- main

  function tick() {
    const now = Date.now();
    for (const c of model.clusters) if (c) tickCard(c, now);
    tickDeploy(now);
    tickConn(now);
    tickFooter(now);
  }

  setInterval(tick, TICK_MS);
  connect();
})();
