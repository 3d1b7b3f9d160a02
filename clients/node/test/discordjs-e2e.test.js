// End to end: examples/discordjs-bot (the real @discordjs/ws 2.0.4 and this
// package) as the cluster command of a real sm-manager, against the fake
// Discord gateway. 8 shards, 2 per cluster (4 clusters), max_concurrency 2,
// the default identify spacing, a fake token through discord.token_env and
// discord.api_base_url at the fake. In order:
//   (a) start: 0 op-9 violations, 0 GET /gateway/bot from the clusters
//   (b) kill -9 of a cluster: its shards RESUME, no IDENTIFY, nothing lost
//   (c) a DEPLOY: every event handled exactly once across both generations
// and, each with a manager of its own, (d) a session budget below the
// cluster's shard count: a killed cluster still RESUMEs; (e) a deploy whose
// new sessions overlap the old ones for a whole identify spacing: the handoff
// skips exactly what the old generation handled.

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeGateway, MANAGER_USER_AGENT_PREFIX } from './fakegateway/index.js';
import { prepareBot, startSm, readEventLog, waitFor, sleep, bucketGaps } from './fakegateway/e2e.js';

const TOKEN = 'ZmFrZQ.fake-token-for-tests.0000000000000000000000000';

// useFleet gives a describe block its fleet: a fake gateway (gwOpts; one shard
// count for the gateway and the topology), the example bot, and an
// sm-manager running it in clusters of 2 shards, handed to set once they are
// up, and all three stopped afterwards. It returns the block's report,
// printed under label at the end when something was put in it.
function useFleet(gwOpts, label, set) {
  const f = { gw: null, bot: null, sm: null };
  const report = {};
  before(async () => {
    f.gw = await startFakeGateway({ token: TOKEN, heartbeatIntervalMs: 5000, ...gwOpts });
    f.bot = await prepareBot();
    f.sm = await startSm({ gw: f.gw, bot: f.bot, token: TOKEN, totalShards: gwOpts.shards, perCluster: 2 });
    set(f);
  });
  after(async () => {
    await f.sm?.stop();
    await f.gw?.close();
    await f.bot?.remove();
    if (label && Object.keys(report).length) console.log(`# ${label}`, JSON.stringify(report));
  });
  return report;
}

describe('@discordjs/ws bot under sm-manager: start, kill -9, deploy', () => {
  let gw;
  let bot;
  let sm;
  const report = useFleet({ shards: 8, maxConcurrency: 2, dispatchIntervalMs: 100 }, 'e2e measurements', (f) => ({ gw, bot, sm } = f));

  test('(a) 8 shards in 4 clusters start: 0 violations, 0 /gateway/bot from clusters, one IDENTIFY per shard', async () => {
    await sm.waitAll((c) => c.state === 'ready' && c.activated && c.generation === 1, 90_000, 'all clusters ready and activated');
    await gw.waitFor(() => new Set(gw.identifies.filter((i) => i.accepted).map((i) => i.shard)).size === 8, 30_000, '8 READY');
    // Every process handles events once it is ACTIVE.
    await waitFor(() => new Set(readEventLog(bot.logDir).filter((e) => e.t === 'MESSAGE_CREATE').map((e) => e.pid)).size === 4, 20_000, 'events in all 4 processes');

    const st = gw.stats();
    const gaps = bucketGaps(gw.identifies.filter((i) => i.accepted));
    Object.assign(report, { startViolations: st.violations, startIdentifies: st.identifies, startMinBucketGapMs: Math.round(gaps.min) });
    assert.equal(st.violations, 0, `op 9 for identifies too close: ${JSON.stringify(gw.violations)}`);
    assert.equal(st.identifies, 8);
    assert.equal(st.sessionStarts, 8);
    assert.ok(gaps.min >= 5000, `identifies of one bucket ${gaps.min} ms apart`);
    assert.equal(st.gatewayBotCallsFromOthers, 0, 'no cluster asked /gateway/bot');
    assert.ok(gw.gatewayBotCalls.length >= 1 && gw.gatewayBotCalls.every((c) => c.userAgent.startsWith(MANAGER_USER_AGENT_PREFIX)));
    for (const c of gw.connections) assert.deepEqual(c.query, { v: '10', encoding: 'json' }, 'json, no compression');
  });

  test('(b) kill -9 of a cluster: its 2 shards RESUME, 0 IDENTIFY, no event lost', async () => {
    const before = await sm.cluster(1);
    const identifies = gw.identifies.length;
    const resumes = gw.resumes.length;
    const tKill = gw.now();
    process.kill(before.pid, 'SIGKILL');
    await sm.waitAll((c) => c.id !== 1 || (c.pid !== before.pid && c.state === 'ready' && c.activated), 30_000, 'cluster 1 respawned');
    await gw.waitFor(() => gw.resumes.slice(resumes).filter((r) => r.accepted).length >= 2, 10_000, '2 RESUMEs');
    const after = await sm.cluster(1);
    const tBack = gw.now();
    await sleep(1500);

    const newResumes = gw.resumes.slice(resumes);
    assert.deepEqual(newResumes.map((r) => [r.shard, r.accepted]).sort(), [[2, true], [3, true]]);
    assert.equal(gw.identifies.length, identifies, 'no IDENTIFY after the kill');
    assert.equal(gw.stats().violations, 0);
    assert.equal(gw.stats().gatewayBotCallsFromOthers, 0);

    // Nothing lost: every event of shards 2-3 from just before the kill to
    // the replacement's recovery was handled by one of the two processes.
    const log = readEventLog(bot.logDir).filter((e) => e.t === 'MESSAGE_CREATE');
    const handled = new Map();
    for (const e of log) handled.set(e.id, [...(handled.get(e.id) ?? []), e.pid]);
    const window = gw.generated.filter((g) => (g.shard === 2 || g.shard === 3) && g.at > tKill - 2000 && g.at < tBack);
    assert.ok(window.length > 20, `only ${window.length} events in the window`);
    const lost = window.filter((g) => !handled.has(g.id));
    assert.deepEqual(lost.map((g) => g.id), [], 'events lost at the kill');
    // Replayed after RESUME (handled by both): at most one heartbeat's worth.
    const twice = window.filter((g) => (handled.get(g.id) ?? []).includes(before.pid) && handled.get(g.id).includes(after.pid));
    Object.assign(report, { killIdentifies: gw.identifies.length - identifies, killResumes: newResumes.filter((r) => r.accepted).length, killReplayedTwice: twice.length, killReplayedByGateway: newResumes.reduce((n, r) => n + r.replayed, 0) });
  });

  test('(c) DEPLOY of all clusters: 0 dispatches lost, 0 handled by both generations', async () => {
    const identifies = gw.identifies.length;
    const resumes = gw.resumes.length;
    const r = await deployAndCount({ gw, bot, sm, clusters: 4 });
    Object.assign(report, {
      deployEvents: r.window.length, deployLost: r.lost.length, deployTwice: r.twice.length, deployHandledByGen: r.byGen,
      deployGates: r.gates, deployIdentifies: gw.identifies.length - identifies,
      deployViolations: gw.violations.map((v) => ({ shard: v.shard, sinceMs: Math.round(v.sinceMs) })),
    });
    assert.ok(r.window.length > 500, `only ${r.window.length} events in the deploy window`);
    r.assertExactlyOnce();
    assert.deepEqual(gw.violations, [], 'op 9 for identifies too close');
    assert.equal(gw.identifies.length - identifies, 8, 'the new generation identified its own 8 sessions');
    assert.equal(gw.resumes.length, resumes, 'and resumed none');
    assert.equal(gw.stats().gatewayBotCallsFromOthers, 0);
  });
});

describe('a session budget below the cluster\'s shard count', () => {
  let gw;
  let bot;
  let sm;
  // 4 shards start, leaving 1 session start: less than a cluster's 2 shards.
  useFleet({ shards: 4, maxConcurrency: 2, remaining: 5, dispatchIntervalMs: 100 }, '', (f) => ({ gw, bot, sm } = f));

  test('(d) a killed cluster still RESUMEs (the REGISTER reply counts resumable shards as remaining)', async () => {
    await sm.waitAll((c) => c.state === 'ready' && c.activated, 60_000, 'both clusters ready');
    await gw.waitFor(() => gw.stats().sessionStarts === 4, 10_000, '4 sessions');
    await sleep(1500); // a heartbeat or two: the manager has every shard's resume state
    assert.equal(gw.remaining, 1);
    const before = await sm.cluster(1);
    const identifies = gw.identifies.length;
    process.kill(before.pid, 'SIGKILL');
    await sm.waitAll((c) => c.id !== 1 || (c.pid !== before.pid && c.state === 'ready' && c.activated), 30_000, 'cluster 1 respawned and ready');
    await gw.waitFor(() => gw.resumes.filter((r) => r.accepted).length === 2, 10_000, '2 RESUMEs');
    assert.deepEqual(gw.resumes.map((r) => [r.shard, r.accepted]).sort(), [[2, true], [3, true]]);
    assert.equal(gw.identifies.length, identifies, 'no IDENTIFY');
    assert.equal(gw.remaining, 1);
    assert.equal(gw.stats().gatewayBotCallsFromOthers, 0);
  });
});


// With one identify bucket a new process's second shard identifies a whole
// spacing after its first, so the first shard's new session receives 5 s of
// events the old process is still handling: the handoff must skip exactly
// those at ACTIVATE.
describe('a deploy whose new sessions run beside the old ones for an identify spacing', () => {
  let gw;
  let bot;
  let sm;
  const report = useFleet({ shards: 4, maxConcurrency: 1, dispatchIntervalMs: 50 }, 'e2e overlap measurements', (f) => ({ gw, bot, sm } = f));

  test('(e) the handoff skips what the old generation handled and replays the rest', async () => {
    await sm.waitAll((c) => c.state === 'ready' && c.activated, 60_000, 'both clusters ready');
    const r = await deployAndCount({ gw, bot, sm, clusters: 2 });
    Object.assign(report, { events: r.window.length, lost: r.lost.length, twice: r.twice.length, byGen: r.byGen, gates: r.gates, violations: gw.violations.length });
    r.assertExactlyOnce();
    for (const g of r.gates) assert.ok(g.skipped >= 40, `cluster ${g.cluster}'s ACTIVATE skipped only ${g.skipped} handled dispatches`);
    assert.deepEqual(gw.violations, []);
  });
});

// Deploys every cluster (one at a time) and counts, for each event the fake
// generated from the DEPLOY until a second after it ended, which processes
// handled it. assertExactlyOnce() checks none was lost or handled twice.
async function deployAndCount({ gw, bot, sm, clusters }) {
  const t0 = gw.now();
  const reply = await sm.deploy({ maxParallel: 1 });
  const gen = reply.generation;
  await sm.waitAll((c) => c.generation === gen && c.state === 'ready' && c.activated, 40_000 * clusters, `generation ${gen} ready and activated everywhere`);
  await sm.waitDeploy('succeeded', 30_000);
  await sleep(1000);
  gw.pause();
  const tEnd = gw.now();
  const window = gw.generated.filter((g) => g.at >= t0 && g.at <= tEnd);
  let handled;
  await waitFor(() => {
    handled = new Map();
    for (const e of readEventLog(bot.logDir)) {
      if (e.t === 'MESSAGE_CREATE') handled.set(e.id, [...(handled.get(e.id) ?? []), e]);
    }
    return window.every((g) => handled.has(g.id));
  }, 10_000, 'every event of the deploy window handled').catch(() => {});
  gw.pause(false);

  const lost = window.filter((g) => !handled.has(g.id));
  const twice = window.filter((g) => (handled.get(g.id)?.length ?? 0) > 1);
  const byGen = {};
  for (const g of window) for (const e of handled.get(g.id) ?? []) byGen[e.generation] = (byGen[e.generation] ?? 0) + 1;
  // The new processes' dispatch gates (their heartbeat stats): what ACTIVATE replayed and skipped.
  const gates = (await sm.status()).clusters.map((c) => ({ cluster: c.id, replayed: c.heartbeat?.gate?.replayed, skipped: c.heartbeat?.gate?.skipped }));
  const story = (shard) => JSON.stringify({
    identifies: gw.identifies.filter((i) => i.shard === shard).map(({ at, conn, accepted }) => ({ at: Math.round(at), conn, accepted })),
    resumes: gw.resumes.filter((r) => r.shard === shard).map(({ at, conn, seq, accepted }) => ({ at: Math.round(at), conn, seq, accepted })),
    closes: gw.closes.filter((c) => c.shard === shard).map(({ at, conn, code, by }) => ({ at: Math.round(at), conn, code, by })),
  });
  return {
    window, lost, twice, byGen, gates,
    assertExactlyOnce() {
      assert.ok(byGen[gen - 1] > 0 && byGen[gen] > 0, `both generations handled some: ${JSON.stringify(byGen)}`);
      assert.deepEqual(lost.map((g) => `${g.shard}:${g.n}`), [], 'lost in the deploy');
      const why = twice.length ? `\ngates: ${JSON.stringify(gates)}\nmanager: ${sm.log().split('\n').filter((l) => /handoff|activat|quiesc/i.test(l)).join('\n')}` : '';
      assert.deepEqual(twice.map((g) => `${g.shard}:${g.n} (at ${Math.round(g.at)}) by ${handled.get(g.id).map((e) => `g${e.generation}/${e.pid}/s${e.s}`)} ${story(g.shard)}`), [], `handled twice in the deploy${why}`);
    },
  };
}
