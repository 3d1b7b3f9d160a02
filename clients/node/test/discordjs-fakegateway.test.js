// The fake Discord gateway itself: that it speaks what @discordjs/ws needs and
// enforces what the e2e tests rely on (op 9 for identifies too close together,
// replay on RESUME, 1000 ends a session and 4200 does not). Raw WebSocket
// clients for the protocol edges, the real @discordjs/ws 2.0.4 for the rest.

import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { WebSocket } from 'ws';
import { REST } from '@discordjs/rest';
import { WebSocketManager, WebSocketShardEvents, CloseCodes } from '@discordjs/ws';
import { startFakeGateway, Op } from './fakegateway/index.js';

const gateways = [];
after(async () => {
  for (const gw of gateways) await gw.close();
});

async function fake(opts) {
  const gw = await startFakeGateway({ token: 'tok', ...opts });
  gateways.push(gw);
  return gw;
}

// A raw gateway client that collects every frame.
async function rawClient(url) {
  const ws = new WebSocket(`${url}?v=10&encoding=json`);
  const frames = [];
  const waiters = [];
  ws.on('message', (data) => {
    const f = JSON.parse(data.toString());
    frames.push(f);
    for (const w of [...waiters]) if (w.pred(f)) { waiters.splice(waiters.indexOf(w), 1); w.resolve(f); }
  });
  const closed = new Promise((resolve) => ws.on('close', (code) => resolve(code)));
  await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
  return {
    ws, frames, closed,
    send: (f) => ws.send(JSON.stringify(f)),
    next(pred, ms = 5000) {
      const hit = frames.find(pred);
      if (hit) return Promise.resolve(hit);
      return new Promise((resolve, reject) => {
        const w = { pred, resolve };
        waiters.push(w);
        setTimeout(() => reject(new Error('no such frame in time')), ms).unref();
      });
    },
  };
}

const identify = (shard, count) => ({ op: Op.Identify, d: { token: 'tok', intents: 0, properties: { os: 'linux', browser: 't', device: 't' }, shard: [shard, count] } });

test('GET /gateway/bot answers in Discord\'s shape, checks the token and counts calls', async () => {
  const gw = await fake({ shards: 8, remaining: 7, total: 1000, maxConcurrency: 2 });
  const ok = await fetch(`${gw.apiBaseUrl}/gateway/bot`, { headers: { authorization: 'Bot tok', 'user-agent': 'x' } });
  assert.equal(ok.status, 200);
  assert.deepEqual(await ok.json(), {
    url: gw.url, shards: 8,
    session_start_limit: { total: 1000, remaining: 7, reset_after: 14_400_000, max_concurrency: 2 },
  });
  const bad = await fetch(`${gw.apiBaseUrl}/gateway/bot`, { headers: { authorization: 'Bot nope' } });
  assert.equal(bad.status, 401);
  assert.equal(gw.stats().gatewayBotCalls, 2);
  assert.equal(gw.stats().gatewayBotCallsFromOthers, 2);
});

test('HELLO, heartbeat ACK, IDENTIFY → READY and rising seq; a second IDENTIFY of the bucket within 5 s gets op 9', async () => {
  const gw = await fake({ maxConcurrency: 2, heartbeatIntervalMs: 1234, dispatchIntervalMs: 20 });
  const a = await rawClient(gw.url);
  const hello = await a.next((f) => f.op === Op.Hello);
  assert.equal(hello.d.heartbeat_interval, 1234);
  a.send({ op: Op.Heartbeat, d: null });
  await a.next((f) => f.op === Op.HeartbeatAck);
  a.send(identify(0, 4));
  const ready = await a.next((f) => f.t === 'READY');
  assert.equal(ready.s, 1);
  assert.deepEqual(ready.d.shard, [0, 4]);
  assert.equal(ready.d.resume_gateway_url, gw.resumeUrl);
  assert.match(ready.d.session_id, /^[0-9a-f]{32}$/);
  assert.equal(ready.d.user.bot, true);
  assert.ok(Array.isArray(ready.d.guilds));
  await a.next((f) => f.op === Op.Dispatch && f.s >= 5);
  const seqs = a.frames.filter((f) => f.op === Op.Dispatch).map((f) => f.s);
  assert.deepEqual(seqs, seqs.map((_, i) => i + 1), 'seq rises by one per dispatch');

  // Shard 2 is in bucket 0 with shard 0: too soon. Shard 1 (bucket 1) is fine.
  const b = await rawClient(gw.url);
  await b.next((f) => f.op === Op.Hello);
  b.send(identify(2, 4));
  const inv = await b.next((f) => f.op === Op.InvalidSession);
  assert.equal(inv.d, false);
  const c = await rawClient(gw.url);
  await c.next((f) => f.op === Op.Hello);
  c.send(identify(1, 4));
  await c.next((f) => f.t === 'READY');
  const st = gw.stats();
  assert.equal(st.violations, 1);
  assert.equal(st.sessionStarts, 2);
  assert.equal(gw.violations[0].bucket, 0);
  for (const x of [a, b, c]) x.ws.close(1000);
});

test('RESUME replays the dispatches after seq, then RESUMED; a session closed with 1000 cannot resume', async () => {
  const gw = await fake({ dispatchIntervalMs: 0 });
  const a = await rawClient(gw.url);
  await a.next((f) => f.op === Op.Hello);
  a.send(identify(0, 1));
  const ready = await a.next((f) => f.t === 'READY');
  const ids = [gw.emitEvent(0), gw.emitEvent(0)];
  const second = await a.next((f) => f.d?.id === ids[1]);
  const seenSeq = second.s - 1; // pretend the second one was missed
  a.ws.close(4200);
  assert.equal(await a.closed, 4200);
  const missed = gw.emitEvent(0); // while disconnected

  const b = await rawClient(gw.resumeUrl);
  await b.next((f) => f.op === Op.Hello);
  b.send({ op: Op.Resume, d: { token: 'tok', session_id: ready.d.session_id, seq: seenSeq } });
  const resumed = await b.next((f) => f.t === 'RESUMED');
  const replayed = b.frames.filter((f) => f.op === Op.Dispatch && f.t !== 'RESUMED').map((f) => f.d.id);
  assert.deepEqual(replayed, [ids[1], missed]);
  assert.equal(resumed.s, seenSeq + 3);
  assert.equal(gw.stats().resumesAccepted, 1);

  b.ws.close(1000);
  await b.closed;
  const c = await rawClient(gw.resumeUrl);
  await c.next((f) => f.op === Op.Hello);
  c.send({ op: Op.Resume, d: { token: 'tok', session_id: ready.d.session_id, seq: resumed.s } });
  const inv = await c.next((f) => f.op === Op.InvalidSession);
  assert.equal(inv.d, false);
  assert.equal(gw.resumes.at(-1).reason, 'invalidated');
  c.ws.close(1000);
});

// The real library against the fake: connect, dispatches, and which close code
// of WebSocketManager#destroy keeps a session resumable for the next process.
test('@discordjs/ws 2.0.4 identifies, gets dispatches, and resumes after destroy({code: CloseCodes.Resuming}) but not after destroy()', async () => {
  const gw = await fake({ maxConcurrency: 2, dispatchIntervalMs: 20, shards: 2 });
  const rest = new REST({ api: gw.apiBaseUrl.replace(/\/v10$/, ''), version: '10' }).setToken('tok');
  const store = new Map();
  const hooks = {
    retrieveSessionInfo: (id) => store.get(id) ?? null,
    updateSessionInfo: (id, info) => (info ? store.set(id, info) : store.delete(id)),
  };
  const run = async (destroyOpts) => {
    const m = new WebSocketManager({ token: 'tok', intents: 0, rest, shardCount: 2, ...hooks });
    const seen = [];
    m.on(WebSocketShardEvents.Dispatch, (p, shardId) => seen.push([shardId, p.t, p.s]));
    await m.connect();
    await gw.waitFor(() => seen.filter(([, t]) => t === 'MESSAGE_CREATE').length >= 6, 5000, 'dispatches');
    const saved = new Map(store);
    const before = gw.closes.filter((c) => c.by === 'client').length;
    await m.destroy(destroyOpts);
    // destroy() resolves on the client's side of the close; the gateway sees
    // it a moment later (later still under load), and the next run's RESUME
    // must find the session detached.
    await gw.waitFor(() => gw.closes.filter((c) => c.by === 'client').length >= before + 2, 5000, 'both shards closed');
    return { saved, seen };
  };
  // destroy() always clears the store through updateSessionInfo(null); keep a copy.
  const first = await run({ code: CloseCodes.Resuming });
  assert.equal(gw.stats().sessionStarts, 2);
  assert.ok(first.seen.some(([, t]) => t === 'READY'));
  assert.deepEqual(gw.closes.filter((c) => c.by === 'client').map((c) => c.code), [4200, 4200]);

  for (const [k, v] of first.saved) store.set(k, v);
  const second = await run(undefined); // default: 1000
  assert.equal(gw.stats().sessionStarts, 2, 'no new session: both shards resumed');
  assert.equal(gw.stats().resumesAccepted, 2);
  assert.ok(second.seen.some(([, t]) => t === 'RESUMED'));
  assert.ok(!second.seen.some(([, t]) => t === 'READY'));

  for (const [k, v] of second.saved) store.set(k, v);
  const third = await run(undefined);
  assert.equal(gw.resumes.filter((r) => r.reason === 'invalidated').length, 2, 'sessions closed with 1000 are gone');
  assert.ok(third.seen.some(([, t]) => t === 'READY'));
  // Each WebSocketManager has its own in-memory throttler, so the third one
  // identified both buckets within 5 s of the first: op 9 twice, then READY
  // after its own throttler waited. That is the fleet-wide gap sm's gate closes.
  assert.equal(gw.stats().violations, 2);
  assert.equal(gw.stats().sessionStarts, 4);
});
