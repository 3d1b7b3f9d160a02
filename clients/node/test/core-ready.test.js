// setReady() and ACTIVATE as a cluster built on the package sees them: it
// heartbeats (stats included) but is not routed until ready; requests that
// waited for it are delivered when it is; ACTIVATE follows, and onActivate
// and whenActive fire once; a later ready:false does not unroute it.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startManager } from './helpers/manager.js';

let m;
let c;
let readyFile;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sm-node-ready-'));

before(async () => {
  // The fixture polls for this file before it calls setReady(true).
  readyFile = path.join(dir, 'ready');
  m = await startManager({ topology: { total_shards: 2, shards_per_cluster: 2 }, cluster: { env: { SMTEST_READY_FILE: readyFile } } });
  c = await m.client();
});
after(async () => {
  await m?.cleanup();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('before setReady(true): heartbeats with stats, not routed; requests wait and are delivered at ready', async () => {
  const st = await m.waitStatus((s) => s.clusters[0].heartbeat?.pid > 0, { what: 'heartbeats before ready' });
  assert.equal(st.clusters[0].state, 'registered');
  assert.equal(st.clusters[0].routed, false);
  assert.equal(st.clusters[0].activated, false);
  const waiting = c.request(0, 'info', null, { timeoutMs: 5000 });
  await m.waitStatus((s) => s.clusters[0].waiting === 1, { what: 'the request queued' });
  fs.writeFileSync(readyFile, '');
  const info = await waiting;
  assert.equal(info.pid, st.clusters[0].pid);
  await m.waitReady();
});

test('ACTIVATE: onActivate, a later onActivate at once, whenActive', async () => {
  const pid = (await m.status()).clusters[0].pid;
  for (const ev of ['activate', 'late_activate', 'when_active']) {
    const got = await m.waitEvents({ ev, pid });
    assert.equal(got.length, 1, `${ev} once`);
    assert.equal(got[0].handoff, null);
  }
  assert.equal((await c.request(0, 'info')).active, true);
});

test('ready latches: setReady(false) does not unroute', async () => {
  assert.deepEqual(await c.request(0, 'setReady', { ready: false }), { ready: false });
  await sleep(350); // a few heartbeats with ready:false
  const st = await m.status();
  assert.equal(st.clusters[0].routed, true);
  assert.equal((await c.request(0, 'ping')).pong, true);
});
