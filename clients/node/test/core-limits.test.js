// The manager's limits.max_frame_bytes, told in its REGISTER reply, bounds
// what a cluster on the package sends: a handler's reply over it becomes a
// frame_too_large REPLY with the request's id, sent at once, instead of a
// frame the manager would refuse without an id (the asker waiting for its
// deadline).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startManager } from './helpers/manager.js';

let m;
let c;

before(async () => {
  m = await startManager({ limits: { max_frame_bytes: 65536 } });
  await m.waitReady();
  c = await m.client();
});
after(() => m?.cleanup());

test("a reply over the manager's max_frame_bytes is frame_too_large with its id", async () => {
  assert.equal((await c.request(0, 'big', { bytes: 1000 })).length, 1000);
  const t0 = Date.now();
  await assert.rejects(c.request(0, 'big', { bytes: 100_000 }, { timeoutMs: 4000 }),
    (e) => e.code === 'frame_too_large' && /max_frame_bytes/.test(e.message));
  assert.ok(Date.now() - t0 < 3000, 'answered at once, not at the deadline');
  assert.equal(await c.request(1, 'ping').then((p) => p.cluster), 1, 'the cluster keeps serving');
});
