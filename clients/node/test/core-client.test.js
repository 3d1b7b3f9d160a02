// The role client (connectClient) against clusters run by cluster-harness's
// simulated bot: cluster 0 answers at once, cluster 1 never becomes ready,
// cluster 2 takes 400 ms per op.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { startManager, harnessCommand } from './helpers/manager.js';
import { connectClient, SmError } from '../src/index.js';

let m;
let c;

before(async () => {
  m = await startManager({
    topology: { total_shards: 3, shards_per_cluster: 1 },
    cluster: {
      command: await harnessCommand('--heartbeat-interval=100ms'),
      env: { SM_HARNESS_FLAGS_1: '--fail-ready', SM_HARNESS_FLAGS_2: '--op-delay=400ms' },
    },
  });
  await m.waitReady([0, 2]);
  c = await m.client({ name: 'core-client' });
});
after(() => m?.cleanup());

test('connectClient(): the topology from the REGISTER reply', () => {
  assert.equal(c.clusters, 3);
  assert.equal(c.totalShards, 3);
  assert.equal(c.shardsPerCluster, 1);
  assert.equal(c.protocol, 1);
  assert.ok(Number.isInteger(c.conn) && c.conn > 0);
  assert.equal(c.connected, true);
});

test('requests to the simulated bot: ping, echo, guild.info, its own error codes', async () => {
  const pong = await c.request(0, 'ping');
  assert.equal(pong.pong, true);
  assert.equal(pong.cluster, 0);
  assert.deepEqual(await c.request('shard:0', 'echo', { hello: 'world', n: [1, 2] }), { hello: 'world', n: [1, 2] });
  const gi = await c.request(0, 'guild.info', { guild_id: '81384788765712384' });
  assert.equal(gi.shard, 1); // (id >> 22) % 3
  await assert.rejects(c.request(0, 'guild.info', { nope: 1 }), (e) => e.code === 'bad_request');
  await assert.rejects(c.request(0, 'frob'), (e) => e.code === 'unknown_op' && /cluster-harness/.test(e.message));
});

test('a request for a cluster with no ready process waits, then fails unavailable at its deadline', async () => {
  const t0 = Date.now();
  await assert.rejects(c.request(1, 'ping', null, { timeoutMs: 300 }),
    (e) => e instanceof SmError && e.code === 'unavailable');
  assert.ok(Date.now() - t0 >= 295, 'it waited for the cluster until the deadline');
  const st = await c.status();
  assert.equal(st.clusters[1].routed, false);
  assert.equal(st.clusters[1].waiting, 0, 'the expired request left the queue');
});

test('a forwarded request the cluster does not answer in time is timeout', async () => {
  await assert.rejects(c.request(2, 'ping', null, { timeoutMs: 100 }), (e) => e.code === 'timeout');
  assert.equal((await c.request(2, 'ping', null, { timeoutMs: 3000 })).cluster, 2);
});

test('broadcast: a cluster with no ready process is unavailable at once; a slow part is timeout', async () => {
  const parts = await c.broadcast('ping', undefined, { timeoutMs: 200 });
  assert.deepEqual(parts.map((p) => p.cluster), [0, 1, 2]);
  assert.equal(parts[0].payload.pong, true);
  assert.equal(parts[1].error.code, 'unavailable');
  assert.equal(parts[2].error.code, 'timeout');
});

test('status(): the snapshot', async () => {
  const st = await c.status();
  assert.deepEqual(st.topology, { total_shards: 3, shards_per_cluster: 1 });
  assert.deepEqual(st.clusters.map((x) => x.id), [0, 1, 2]);
  assert.equal(st.clusters[0].state, 'ready');
  assert.equal(st.clusters[1].state, 'registered');
  assert.equal(typeof st.discord.identify_spacing_ms, 'number');
});

test('watch(): a snapshot first, then events; close() ends the subscription', async () => {
  const events = [];
  const w = await c.watch((ev) => events.push(ev));
  const deadline = Date.now() + 5000;
  while (!events.some((e) => e.type === 'heartbeat') && Date.now() < deadline) await sleep(20);
  assert.equal(events[0].type, 'snapshot');
  assert.equal(events[0].status.clusters.length, 3);
  const hb = events.find((e) => e.type === 'heartbeat');
  assert.ok(hb, 'heartbeat events follow');
  assert.equal(typeof hb.cluster, 'number');
  // A second subscription runs on its own connection: no WATCH-twice refusal.
  const other = [];
  const w2 = await c.watch((ev) => other.push(ev));
  await w.close();
  const n = events.length;
  await sleep(400);
  assert.equal(events.length, n, 'no events after close()');
  assert.ok(other.length > 1, 'the other subscription still runs');
  await w2.close();
  // The main connection still serves requests.
  assert.equal((await c.request(0, 'ping')).pong, true);
});

test('close(): requests in flight fail unavailable; nothing is sent afterwards', async () => {
  const d = await connectClient({ socket: m.socket, logger: null });
  const inflight = d.request(2, 'ping', null, { timeoutMs: 3000 });
  await sleep(50);
  await d.close();
  await assert.rejects(inflight, (e) => e.code === 'unavailable');
  await assert.rejects(d.request(0, 'ping'), (e) => e.code === 'unavailable' && /not connected/.test(e.message));
  assert.equal(d.send(0, 'ping'), false);
  assert.equal(d.connected, false);
});
