// cluster.identify(): the manager's identify gate as a cluster built on the
// package sees it: grants, the deadline, withdrawal through an AbortSignal
// (IDENTIFY_CANCEL: a withdrawn ask spends nothing), a shard of another
// cluster; and, with a Discord token (a fake REST API here), the gateway
// information in the REGISTER reply and a budget refusal's own code.

import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startManager, startFakeDiscordRest } from './helpers/manager.js';

describe('the identify gate (1.5 s spacing, one bucket)', () => {
  let m;
  let c;
  before(async () => {
    m = await startManager({ discord: { identify_spacing: '1500ms', max_concurrency: 1 } });
    await m.waitReady();
    c = await m.client();
  });
  after(() => m?.cleanup());

  const identify = (cluster, p) => c.request(cluster, 'identify', p, { timeoutMs: 8000 });
  const discord = async () => (await c.status()).discord;

  test('a free bucket grants at once: {granted, shard, bucket}', async () => {
    assert.deepEqual(await identify(0, { shard: 1 }), { ok: true, payload: { granted: true, shard: 1, bucket: 0 } });
  });

  test('timeoutMs: no slot before it, SmError timeout', async () => {
    const r = await identify(0, { shard: 0, timeoutMs: 200 });
    assert.equal(r.ok, false);
    assert.equal(r.code, 'timeout');
    assert.equal(r.name, 'SmError');
  });

  test('a shard of another cluster is bad_frame', async () => {
    const r = await identify(0, { shard: 3 });
    assert.equal(r.code, 'bad_frame');
  });

  test('an aborted ask is withdrawn (IDENTIFY_CANCEL) and spends nothing (i11)', async () => {
    const granted = (await discord()).identify_granted;
    // Shard 2 would go first (lowest shard in the bucket) if it still waited.
    const r = await identify(1, { shard: 2, abortAfterMs: 150 });
    assert.equal(r.ok, false);
    assert.equal(r.name, 'AbortError', 'rejects with the signal\'s reason');
    const w = await m.waitStatus((st) => st.discord.identify_waiting === 0, { timeoutMs: 1000, what: 'the ask withdrawn' });
    assert.equal(w.discord.identify_granted, granted);
    const next = await identify(1, { shard: 3 });
    assert.deepEqual(next, { ok: true, payload: { granted: true, shard: 3, bucket: 0 } });
    assert.equal((await discord()).identify_granted, granted + 1, 'only shard 3 was granted');
  });
});

describe('with a Discord token: gateway information and budget_refused (i11)', () => {
  let m;
  let rest;
  let c;
  before(async () => {
    rest = await startFakeDiscordRest({ url: 'wss://gateway.fake.invalid', shards: 6, total: 1000, remaining: 50, maxConcurrency: 1 });
    m = await startManager({
      env: { SMTEST_DISCORD_TOKEN: 'fake.token.for-tests' },
      discord: { token_env: 'SMTEST_DISCORD_TOKEN', api_base_url: rest.baseURL, budget_floor: 100 },
    });
    await m.waitReady();
    c = await m.client();
  });
  after(async () => {
    await m?.cleanup();
    await rest?.close();
  });

  test('the REGISTER reply carries /gateway/bot in Discord\'s shape, shards in force', async () => {
    const info = await c.request(0, 'info');
    assert.ok(rest.state.calls >= 1);
    assert.equal(info.gateway.url, 'wss://gateway.fake.invalid');
    assert.equal(info.gateway.shards, 4, 'the topology in force, not the recommendation');
    assert.equal(info.gateway.session_start_limit.total, 1000);
    assert.equal(info.gateway.session_start_limit.max_concurrency, 1);
    assert.ok(info.gateway.session_start_limit.remaining > 0, 'a first start may identify');
  });

  test('a first start is granted below the floor; a respawn is refused with budget_refused and told it can only resume', async () => {
    assert.equal((await c.request(0, 'identify', { shard: 0 })).ok, true);
    const st = await m.status();
    const pid = st.clusters[0].pid;
    process.kill(pid, 'SIGKILL');
    const after = await m.waitStatus((s) => s.clusters[0].pid !== pid && s.clusters[0].state === 'ready', { what: 'cluster 0 respawned' });
    const info = await c.request(0, 'info');
    assert.equal(info.pid, after.clusters[0].pid);
    assert.equal(info.start, 'respawn');
    assert.equal(Object.keys(info.resume).length, 2);
    assert.equal(info.gateway.session_start_limit.remaining, 2, '0 identifies granted to a restart at the floor, plus 2 resumes');
    const r = await c.request(0, 'identify', { shard: 1 });
    assert.equal(r.ok, false);
    assert.equal(r.code, 'budget_refused');
    assert.match(r.message, /floor/);
  });
});
