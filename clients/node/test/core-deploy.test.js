// The lifecycle a cluster built on the package goes through: a DEPLOY sent
// as a client (the old process gets QUIESCE, finishes its requests, sends
// QUIESCED with its resume state and handoff, exits 0; the new one gets
// ACTIVATE with that handoff), SIGTERM treated as QUIESCE, kill -9, and the
// start kind and resume state each replacement is given.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { startManager, waitExit } from './helpers/manager.js';

let m;
let c;
let gen1; // STATUS before anything moved
const deploy = {}; // what the DEPLOY of cluster 1 did

before(async () => {
  m = await startManager({
    cluster: { env: { SMTEST_QUIESCE_IDENTIFY: '1', SMTEST_READY_DELAY_MS: '200' } },
    discord: { identify_spacing: '100ms' },
  });
  gen1 = await m.waitReady();
  c = await m.client();

  // A request the old process holds when QUIESCE comes: it must be answered.
  const held = c.request(1, 'sleep', { ms: 800 }, { timeoutMs: 4000 });
  await sleep(20);
  // Requests sent all through the deploy: none may fail.
  let stop = false;
  const pings = (async () => {
    const out = [];
    while (!stop) {
      out.push(await c.request('shard:2', 'ping', null, { timeoutMs: 4000 }).then((p) => p, (e) => e));
      await sleep(5);
    }
    return out;
  })();
  deploy.reply = await c.deploy({ clusters: [1] });
  deploy.second = await c.deploy({ clusters: [0] }).then(() => null, (e) => e);
  deploy.held = await held;
  deploy.status = await m.waitStatus((st) => st.clusters[1].generation === 2 && st.clusters[1].activated
    && st.deploy?.state !== 'running', { what: 'cluster 1 at generation 2, activated' });
  stop = true;
  deploy.pings = await pings;
  await waitExit(gen1.clusters[1].pid);
});
after(() => m?.cleanup());

test('deploy(): the DEPLOY reply; a second DEPLOY meanwhile is deploy_in_progress; a bad plan is bad_frame', async () => {
  assert.equal(deploy.reply.generation, 2);
  assert.match(deploy.reply.deploy_id, /^deploy-/);
  assert.deepEqual(deploy.reply.from, { total_shards: 4, shards_per_cluster: 2 });
  assert.equal(deploy.reply.reclustering, false);
  assert.equal(deploy.second?.code, 'deploy_in_progress');
  await assert.rejects(c.deploy({ clusters: [7] }), (e) => e.code === 'bad_frame');
});

test('the old process: QUIESCE, its held request answered, QUIESCED, exit 0', () => {
  const oldPid = gen1.clusters[1].pid;
  const old = m.events({ pid: oldPid });
  const kinds = old.map((e) => e.ev);
  assert.ok(kinds.includes('quiesce') && kinds.includes('quiesced'), kinds.join(','));
  assert.equal(old.find((e) => e.ev === 'quiesce').source, 'QUIESCE');
  assert.ok(kinds.indexOf('handoff_set') < kinds.indexOf('quiesced'), 'onQuiesce ran before QUIESCED');
  assert.equal(deploy.held.pid, oldPid, 'the request it held at QUIESCE was answered by it');
  assert.match(m.log(), new RegExp(`cluster quiesced.*pid=${oldPid}`));
  assert.match(m.log(), new RegExp(`cluster exited.*pid=${oldPid} status="exit status 0" expected=true`));
  const bad = deploy.pings.filter((p) => p instanceof Error);
  assert.deepEqual(bad, [], 'no request failed during the deploy');
  assert.ok(deploy.pings.length > 0);
});

test('the old process may not identify while quiescing: forbidden', () => {
  const [r] = m.events({ ev: 'quiesce_identify', pid: gen1.clusters[1].pid });
  assert.equal(r.ok, false);
  assert.equal(r.code, 'forbidden');
});

test('the new process: registered active:false, ACTIVATE only after the old one exited', () => {
  const newPid = deploy.status.clusters[1].pid;
  assert.notEqual(newPid, gen1.clusters[1].pid);
  const [reg] = m.events({ ev: 'registered', pid: newPid });
  assert.equal(reg.generation, 2);
  assert.equal(reg.active, false);
  assert.deepEqual(reg.resume, {}, 'a deploy candidate is handed no resume state');
  const [act] = m.events({ ev: 'activate', pid: newPid });
  const [quiesced] = m.events({ ev: 'quiesced', pid: gen1.clusters[1].pid });
  assert.ok(act.at >= quiesced.at, 'ACTIVATE follows the old QUIESCED');
});

test('start kinds: first for the cold start, candidate for the deploy (i11)', () => {
  for (const cl of gen1.clusters) {
    assert.equal(m.events({ ev: 'registered', pid: cl.pid })[0].start, 'first');
  }
  assert.equal(m.events({ ev: 'registered', pid: deploy.status.clusters[1].pid })[0].start, 'candidate');
});

test('ACTIVATE carries the handoff the old process set (i11)', () => {
  const newPid = deploy.status.clusters[1].pid;
  const [act] = m.events({ ev: 'activate', pid: newPid });
  const [set] = m.events({ ev: 'handoff_set', pid: gen1.clusters[1].pid });
  assert.ok(set.handoff.handled >= 1);
  assert.deepEqual(act.handoff, set.handoff);
});

test('SIGTERM is QUIESCE: QUIESCED with the resume state, exit 0; the respawn resumes those sessions', async () => {
  const oldPid = gen1.clusters[0].pid;
  process.kill(oldPid, 'SIGTERM');
  await waitExit(oldPid);
  const old = m.events({ pid: oldPid });
  assert.equal(old.find((e) => e.ev === 'quiesce').source, 'SIGTERM');
  assert.ok(old.some((e) => e.ev === 'quiesced'));
  assert.equal(m.events({ ev: 'quiesce_identify', pid: oldPid }).length, 0);
  assert.match(m.log(), new RegExp(`cluster exited.*pid=${oldPid} status="exit status 0"`));
  const st = await m.waitReady([0]);
  const newPid = st.clusters[0].pid;
  const [reg] = m.events({ ev: 'registered', pid: newPid });
  assert.deepEqual(reg.resume, {
    0: { sessionId: `s1x0x${oldPid}`, sequence: 1, resumeURL: 'wss://gateway.test.invalid/?shard=0', shardId: 0, shardCount: 4 },
    1: { sessionId: `s1x1x${oldPid}`, sequence: 1, resumeURL: 'wss://gateway.test.invalid/?shard=1', shardId: 1, shardCount: 4 },
  });
});

test('kill -9: the respawn is handed the sessions the dead process reported on heartbeats', async () => {
  const pid = deploy.status.clusters[1].pid;
  process.kill(pid, 'SIGKILL');
  const st = await m.waitStatus((s) => s.clusters[1].pid !== pid && s.clusters[1].state === 'ready' && s.clusters[1].activated,
    { what: 'cluster 1 respawned' });
  const [reg] = m.events({ ev: 'registered', pid: st.clusters[1].pid });
  assert.equal(reg.generation, 2, 'a respawn runs the same generation');
  assert.equal(reg.resume[2].sessionId, `s2x2x${pid}`);
  assert.equal(reg.resume[3].sessionId, `s2x3x${pid}`);
  assert.equal(reg.resume[3].shardCount, 4);
  const [act] = m.events({ ev: 'activate', pid: st.clusters[1].pid });
  assert.equal(act.handoff, null, 'a respawn after a crash has no handoff');
});

test('start kind respawn after SIGTERM and kill -9 (i11)', () => {
  const starts = m.events({ ev: 'registered' }).slice(-2).map((e) => e.start);
  assert.deepEqual(starts, ['respawn', 'respawn']);
});
