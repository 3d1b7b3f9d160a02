// The package under Bun: the fixture cluster run by `bun` under a real
// sm-manager (requests, identify, re-adoption after SIGKILL of the manager,
// a DEPLOY's QUIESCE/ACTIVATE), and a role client run by `bun`. Bun is a
// devDependency (npm's bun package ships the binary), and `npm test` puts
// node_modules/.bin on PATH, so these run there; $SM_TEST_BUN names another
// bun binary; without any they are skipped.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { startManager, fixture } from './helpers/manager.js';

function findBun() {
  for (const candidate of [process.env.SM_TEST_BUN, 'bun']) {
    if (!candidate) continue;
    try {
      execFileSync(candidate, ['--version'], { stdio: 'ignore' });
      return candidate;
    } catch {
      // not there
    }
  }
  return null;
}

const bun = findBun();
const skip = bun ? false : 'no bun binary (set SM_TEST_BUN or put bun on PATH)';
let m;
let c;

before(async () => {
  if (skip) return;
  m = await startManager({ stateDir: true, cluster: { command: [bun, fixture('cluster.js')] } });
  await m.waitReady();
  c = await m.client();
});
after(() => m?.cleanup());

test('a cluster under Bun: requests, broadcast, deadlines, identify', { skip }, async () => {
  const info = await c.request(0, 'info');
  assert.deepEqual(info.shardIds, [0, 1]);
  assert.equal(info.active, true);
  assert.deepEqual(await c.request('shard:3', 'echo', { é: [1, null] }), { é: [1, null] });
  assert.equal((await c.request(1, 'relay', { target: 0, op: 'sleep', payload: { ms: 400 }, timeoutMs: 100 })).code, 'timeout');
  assert.deepEqual((await c.broadcast('ping')).map((r) => r.payload.cluster), [0, 1]);
  assert.deepEqual(await c.request(0, 'identify', { shard: 1 }), { ok: true, payload: { granted: true, shard: 1, bucket: 0 } });
});

test('a role client under Bun: request and watch', { skip }, () => {
  const script = `
    import { connectClient } from ${JSON.stringify(new URL('../src/index.js', import.meta.url).pathname)};
    const c = await connectClient({ socket: ${JSON.stringify(m.socket)}, logger: null });
    const pong = await c.request('shard:2', 'ping');
    const types = [];
    const w = await c.watch((e) => types.push(e.type));
    while (!types.includes('heartbeat')) await new Promise((r) => setTimeout(r, 20));
    await w.close();
    await c.close();
    console.log(JSON.stringify({ pong, first: types[0] }));`;
  const out = JSON.parse(execFileSync(bun, ['-e', script], { encoding: 'utf8', timeout: 15_000 }));
  assert.equal(out.pong.cluster, 1);
  assert.equal(out.first, 'snapshot');
});

test('under Bun: re-adopted after a manager restart; a DEPLOY quiesces and activates', { skip }, async () => {
  const pids = (await m.status()).clusters.map((x) => x.pid);
  await m.restart();
  await m.waitEvents({ ev: 'reconnect' }, 2);
  const st = await m.waitReady();
  assert.deepEqual(st.clusters.map((x) => x.pid), pids);
  await c.deploy({ clusters: [1] });
  const after = await m.waitStatus((s) => s.clusters[1].generation === 2 && s.clusters[1].activated, { what: 'generation 2' });
  const old = m.events({ pid: pids[1] }).map((e) => e.ev);
  assert.ok(old.includes('quiesce') && old.includes('quiesced'), old.join(','));
  assert.equal(m.events({ ev: 'activate', pid: after.clusters[1].pid }).length, 1);
});
