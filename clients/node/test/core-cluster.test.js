// Cluster processes built on the package (test/fixtures/cluster.js) under a
// real sm-manager: registration and what the handle exposes, heartbeats,
// handlers and their errors, requests, broadcast and fire-and-forget sent by
// a cluster, deadlines, and refused REGISTERs.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startManager } from './helpers/manager.js';
import { connect, SmError } from '../src/index.js';

let m;
let c;

before(async () => {
  m = await startManager();
  await m.waitReady();
  c = await m.client();
});
after(() => m?.cleanup());

test('connect(): identity and settings from the REGISTER reply', async () => {
  for (const [id, shards] of [[0, [0, 1]], [1, [2, 3]]]) {
    const info = await c.request(id, 'info');
    assert.equal(info.cluster, id);
    assert.equal(info.generation, 1);
    assert.deepEqual(info.shardIds, shards);
    assert.equal(info.shardFirst, shards[0]);
    assert.equal(info.shardLast, shards[1]);
    assert.equal(info.totalShards, 4);
    assert.equal(info.heartbeatIntervalMs, 100, "the manager's heartbeat.interval");
    assert.deepEqual(info.identifyGate, { gate: true, maxConcurrency: 1, spacingMs: 1 });
    assert.equal(info.active, true, 'ACTIVATE came after ready');
    assert.equal(info.quiescing, false);
    assert.equal(info.gateway, null, 'no Discord token: no gateway information');
  }
  const [reg] = m.events({ ev: 'registered', cluster: 0 });
  assert.equal(reg.active, false, 'a first REGISTER reply says active:false');
  const [act] = m.events({ ev: 'activate', cluster: 0 });
  assert.equal(act.handoff, null, 'a first start has no handoff');
});

test('heartbeats carry the ready flag and the stats payload', async () => {
  const st = await m.waitStatus((s) => s.clusters.every((cl) => cl.heartbeat?.pid > 0), { what: 'heartbeat payloads' });
  for (const cl of st.clusters) {
    assert.equal(cl.state, 'ready');
    assert.equal(cl.routed, true);
    assert.equal(cl.heartbeat.cluster, cl.id);
    assert.equal(cl.heartbeat.pid, cl.pid);
  }
  const before = (await c.request(0, 'info')).handled;
  await c.request(0, 'ping');
  await m.waitStatus((s) => s.clusters[0].heartbeat.handled > before, { what: 'stats function read on each beat' });
});

test('handle(): payloads both ways, undefined as null, unknown ops', async () => {
  const payload = { s: 'é\u2028✓', n: [1, 2.5, -3], nested: { t: true, f: false, z: null } };
  assert.deepEqual(await c.request(0, 'echo', payload), payload);
  assert.equal(await c.request(1, 'echo'), null, 'no payload: the handler gets undefined and echoes null');
  assert.equal(await c.request(1, 'nothing'), null);
  await assert.rejects(c.request(0, 'frob'), (e) => e instanceof SmError && e.code === 'unknown_op' && /frob/.test(e.message));
});

test('handler errors become REPLY errors with their code, or handler_error', async () => {
  await assert.rejects(c.request(0, 'fail', { code: 'not_found', message: 'no such guild' }),
    (e) => e.code === 'not_found' && e.message === 'no such guild');
  await assert.rejects(c.request(0, 'fail', { message: 'plain' }), (e) => e.code === 'handler_error' && e.message === 'plain');
  await assert.rejects(c.request(1, 'throwsync'), (e) => e.code === 'handler_error' && /synchronously/.test(e.message));
  await assert.rejects(c.request(1, 'bigint'), (e) => e.code === 'handler_error' && /JSON/.test(e.message));
  // A reply over max_frame_bytes (1 MiB here) would never reach the sender.
  await assert.rejects(c.request(0, 'big', { bytes: (1 << 20) + 10 }), (e) => e.code === 'frame_too_large');
  assert.equal((await c.request(0, 'big', { bytes: 100_000 })).length, 100_000);
});

test('targets: cluster id, digits, shard:, guild:; bad ones are unknown_target', async () => {
  assert.equal((await c.request(1, 'ping')).cluster, 1);
  assert.equal((await c.request('0', 'ping')).cluster, 0);
  assert.equal((await c.request('shard:3', 'ping')).cluster, 1);
  // (snowflake >> 22) % 4 = 2 for 81384788765712384 → cluster 1.
  assert.equal((await c.request('guild:81384788765712384', 'ping')).cluster, 1);
  for (const t of [2, '2', '03', 'shard:4', 'guild:x', '', ' 1']) {
    await assert.rejects(c.request(t, 'ping'), (e) => e.code === 'unknown_target', String(t));
  }
  assert.throws(() => c.send(-1, 'ping'), TypeError);
  assert.throws(() => c.send(1.5, 'ping'), TypeError);
  await assert.rejects(c.request(0, 'STATUS'), TypeError, 'structural ops are not business ops');
});

test('a cluster sends requests, broadcasts and fire-and-forget through the manager', async () => {
  const r = await c.request(1, 'relay', { target: 0, op: 'ping' });
  assert.deepEqual(r.ok, true);
  assert.equal(r.payload.cluster, 0);
  // To itself, through the manager.
  assert.equal((await c.request(1, 'relay', { target: 'shard:2', op: 'ping' })).payload.cluster, 1);
  assert.deepEqual(await c.request(1, 'relay', { target: 9, op: 'ping' }),
    { ok: false, code: 'unknown_target', name: 'SmError', message: 'unknown target: "9" is not a cluster of 2' });
  assert.equal((await c.request(0, 'relay', { target: 1, op: 'sleep', payload: { ms: 1000 }, timeoutMs: 150 })).code, 'timeout');

  const b = await c.request(0, 'relayBroadcast', { op: 'echo', payload: [1, 2] });
  assert.deepEqual(b, { ok: true, payload: [{ cluster: 0, payload: [1, 2] }, { cluster: 1, payload: [1, 2] }] });

  const notes = (await c.request(1, 'info')).notes;
  assert.deepEqual(await c.request(0, 'fire', { target: 1, op: 'note' }), { sent: true });
  assert.deepEqual(await c.request(0, 'fire', { target: 1, op: 'note' }), { sent: true });
  // The notes went out on cluster 0's connection before its replies; ask
  // cluster 0 to ask cluster 1, so the question queues behind them.
  const after = await c.request(0, 'relay', { target: 1, op: 'info' });
  assert.equal(after.payload.notes, notes + 2);
});

test('broadcast: one result per cluster, errors as SmError parts', async () => {
  const ok = await c.broadcast('ping');
  assert.deepEqual(ok.map((r) => [r.cluster, r.payload.pong]), [[0, true], [1, true]]);
  const failed = await c.broadcast('fail', { code: 'nope', message: 'refused' });
  assert.equal(failed.length, 2);
  for (const [i, r] of failed.entries()) {
    assert.equal(r.cluster, i);
    assert.ok(r.error instanceof SmError);
    assert.equal(r.error.code, 'nope');
    assert.equal(r.payload, undefined);
  }
  const nulls = await c.broadcast('nothing');
  assert.deepEqual(nulls, [{ cluster: 0, payload: null }, { cluster: 1, payload: null }]);
});

test('deadlines: timeout_ms reaches the manager, which answers timeout', async () => {
  const t0 = Date.now();
  await assert.rejects(c.request(0, 'sleep', { ms: 1000 }, { timeoutMs: 200 }),
    (e) => e.code === 'timeout' && /did not reply/.test(e.message), 'the manager\'s timeout, not the local timer');
  assert.ok(Date.now() - t0 >= 195);
  // A broadcast part that runs out is timeout; the others answer.
  const parts = await c.broadcast('sleep', { ms: 0 }, { timeoutMs: 2000 });
  assert.ok(parts.every((p) => p.payload?.slept === 0));
  // An aborted request rejects with the signal's reason at once.
  const ac = new AbortController();
  const p = c.request(1, 'sleep', { ms: 500 }, { signal: ac.signal });
  ac.abort(new Error('changed my mind'));
  await assert.rejects(p, /changed my mind/);
});

test('fire-and-forget with a bad target: the manager says so without an id', async () => {
  const warned = new Promise((resolve) => c.once('warning', resolve));
  assert.equal(c.send('7', 'note'), true);
  const w = await warned;
  assert.equal(w.code, 'unknown_target');
});

test('a REGISTER with a wrong token is refused: forbidden, final', async () => {
  await assert.rejects(
    connect({ socket: m.socket, cluster: 0, generation: 1, token: 'f'.repeat(48), logger: null, handleSigterm: false }),
    (e) => e instanceof SmError && e.code === 'forbidden' && /token/.test(e.message),
  );
});

test('a REGISTER without cluster and generation is refused by the manager: bad_frame', async () => {
  await assert.rejects(
    connect({ env: { SM_SOCKET: m.socket, SM_TOKEN: 'x' }, logger: null, handleSigterm: false }),
    (e) => e.code === 'bad_frame' && /cluster and generation/.test(e.message),
  );
  // A malformed SM_* value is refused before anything is sent.
  await assert.rejects(connect({ env: { SM_SOCKET: m.socket, SM_CLUSTER: 'one' } }), (e) => e.code === 'bad_config' && /SM_CLUSTER/.test(e.message));
  await assert.rejects(connect({ env: {} }), (e) => e.code === 'bad_config' && /SM_SOCKET/.test(e.message));
});
