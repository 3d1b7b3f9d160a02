// A cluster process orphaned in a mesh (docs/multihost.md): a manager with
// [mesh] passes SM_ORPHAN_TIMEOUT_MS (lease / 8) to its clusters. SIGKILL the
// manager alone: each cluster built on the package exits 75 once it has not
// reached the socket for that long, before the lease could pass to another
// host. Real sm-manager, real nats-server (built from its Go module).

import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startManager, binaries, REPO_DIR } from './helpers/manager.js';
import { ORPHAN_EXIT_CODE } from '../src/index.js';

const managers = [];
const servers = [];
after(async () => {
  await Promise.all(managers.map((m) => m.cleanup()));
  for (const s of servers) s.kill('SIGKILL');
});

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// A nats-server with JetStream on a free loopback port.
async function natsServer() {
  const { dir } = await binaries();
  const bin = path.join(dir, 'nats-server');
  if (!fs.existsSync(bin)) {
    execFileSync('go', ['build', '-o', dir + '/', 'github.com/nats-io/nats-server/v2'], { cwd: REPO_DIR, stdio: ['ignore', 'inherit', 'inherit'] });
  }
  const port = await freePort();
  const store = fs.mkdtempSync(path.join(os.tmpdir(), 'sm-node-nats-'));
  const proc = spawn(bin, ['-js', '-a', '127.0.0.1', '-p', String(port), '-sd', store], { stdio: 'ignore' });
  servers.push(proc);
  proc.once('exit', () => fs.rmSync(store, { recursive: true, force: true }));
  const deadline = Date.now() + 15_000;
  for (;;) {
    const ok = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => { s.destroy(); resolve(true); });
      s.once('error', () => resolve(false));
    });
    if (ok) return `nats://127.0.0.1:${port}`;
    if (Date.now() > deadline) throw new Error('nats-server did not listen within 15 s');
    await sleep(20);
  }
}

test('orphaned by a SIGKILLed mesh manager: every cluster exits 75 after SM_ORPHAN_TIMEOUT_MS', async () => {
  const url = await natsServer();
  const m = await startManager({ mesh: { nats_url: url, host_id: 'node-a', lease: '2s' } });
  managers.push(m);
  const st = await m.waitReady(undefined, { timeoutMs: 30_000 });
  assert.equal(st.hosts?.length, 1, 'the manager joined the mesh');
  const [reg] = await m.waitEvents({ ev: 'registered' }, 2);
  assert.ok(reg, 'the clusters registered');

  const killedAt = Date.now();
  await m.kill('SIGKILL');
  const exits = await m.waitEvents({ ev: 'exit' }, 2, 15_000);
  const orphaned = m.events().filter((e) => e.ev === 'orphaned');
  assert.equal(orphaned.length, 2, 'both clusters said they were orphaned');
  for (const o of orphaned) assert.match(o.message, /SM_ORPHAN_TIMEOUT_MS 250/);
  for (const e of exits) {
    assert.equal(e.code, ORPHAN_EXIT_CODE, `cluster ${e.cluster} exited ${e.code}`);
    // Not before the timeout: the count starts at the loss of the connection.
    assert.ok(e.at - killedAt >= 250, `cluster ${e.cluster} exited ${e.at - killedAt} ms after the kill, before the timeout`);
  }
  const slowest = Math.max(...exits.map((e) => e.at - killedAt));
  console.log(`# both clusters exited ${ORPHAN_EXIT_CODE} within ${slowest} ms of the manager's SIGKILL (SM_ORPHAN_TIMEOUT_MS 250, lease 2 s)`);
});

test('orphanTimeoutMs 0 and no SM_ORPHAN_TIMEOUT_MS: never orphaned; a bad value is refused', async () => {
  const { Cluster } = await import('../src/cluster.js');
  const env = { SM_SOCKET: '/nonexistent', SM_CLUSTER: '0', SM_GENERATION: '1', SM_TOKEN: 't' };
  assert.equal(new Cluster({ env, logger: null }).orphanTimeoutMs, 0);
  assert.equal(new Cluster({ env: { ...env, SM_ORPHAN_TIMEOUT_MS: '1250' }, logger: null }).orphanTimeoutMs, 1250);
  assert.equal(new Cluster({ env: { ...env, SM_ORPHAN_TIMEOUT_MS: '1250' }, orphanTimeoutMs: 0, logger: null }).orphanTimeoutMs, 0);
  for (const bad of ['0', '-1', '1.5', 'x']) {
    assert.throws(() => new Cluster({ env: { ...env, SM_ORPHAN_TIMEOUT_MS: bad }, logger: null }), (e) => e.code === 'bad_config', bad);
  }
});
