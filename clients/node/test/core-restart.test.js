// Reconnection after a manager restart (docs/protocol.md, "After a manager
// restart"): SIGKILL the manager, start it again; clusters built on the
// package reconnect with backoff and send the same REGISTER. With a state
// directory they are re-adopted and keep serving; without one their
// REGISTER is refused (forbidden), which is final: they exit 1.

import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { startManager, waitExit, processAlive } from './helpers/manager.js';

const managers = [];
after(() => Promise.all(managers.map((m) => m.cleanup())));

async function waitFor(pred, what, ms = 10_000) {
  const deadline = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

test('with state.dir: the clusters re-REGISTER with the same token and keep serving', async () => {
  const m = await startManager({ stateDir: true });
  managers.push(m);
  const before = await m.waitReady();
  const pids = before.clusters.map((cl) => cl.pid);
  const c = await m.client();
  const reconnects = [];
  const disconnects = [];
  c.on('reconnect', (p) => reconnects.push(p));
  c.on('disconnect', () => disconnects.push(Date.now()));
  const events = [];
  const w = await c.watch((ev) => events.push(ev));

  // In flight when the manager dies: a client's request, and one a cluster sent.
  assert.deepEqual(await c.request(0, 'relayLater', { target: 1, op: 'sleep', payload: { ms: 2500 }, tag: 'inflight' }), { started: true });
  const mine = c.request(1, 'sleep', { ms: 2500 }).then(() => null, (e) => e);
  await sleep(150);
  await m.kill('SIGKILL');

  const lost = await mine;
  assert.equal(lost?.code, 'unavailable');
  assert.match(lost.message, /connection to the manager lost/);
  const [relayed] = await m.waitEvents({ ev: 'relay_result', tag: 'inflight' });
  assert.equal(relayed.ok, false);
  assert.equal(relayed.code, 'unavailable', "a cluster's pending request fails when its connection drops");
  assert.equal(c.connected, false);
  assert.equal(c.send(0, 'ping'), false, 'fire-and-forget while disconnected is dropped');
  await assert.rejects(c.request(0, 'ping'), (e) => e.code === 'unavailable');
  await m.waitEvents({ ev: 'disconnect' }, 2);
  for (const pid of pids) assert.ok(processAlive(pid), 'clusters outlive their manager');

  await m.start();
  await m.waitEvents({ ev: 'reconnect' }, 2);
  const st = await m.waitReady();
  assert.deepEqual(st.clusters.map((cl) => cl.pid), pids, 'the same processes were re-adopted');
  // The clusters re-registered; this client reconnects on its own backoff,
  // which may end later: wait for it before asking through it.
  await waitFor(() => reconnects.length === 1, "the client's reconnect");
  for (const id of [0, 1]) {
    const info = await c.request(id, 'info');
    assert.equal(info.pid, pids[id]);
    assert.equal(info.reconnects, 1);
    assert.equal(info.active, true);
  }
  assert.equal(m.events({ ev: 'activate' }).length, 2, 'no second ACTIVATE for a re-adopted process');
  assert.equal(m.events({ ev: 'registered' }).length, 2, 'no new process was spawned');

  assert.equal(reconnects[0].clusters, 2);
  assert.equal(disconnects.length, 1);
  // The watch subscribed again: a second snapshot.
  await waitFor(() => events.filter((e) => e.type === 'snapshot').length === 2, 'a new snapshot after the restart');
  await w.close();
  // The cluster's 2.5 s handler finished after the restart: its reply was
  // dropped, since the manager had already answered that request.
  await sleep(Math.max(0, 2600 - 150));
  assert.equal((await c.request(1, 'ping')).pid, pids[1]);
  assert.doesNotMatch(m.log(), /REPLY for unknown request id/);
});

test('without state.dir: the re-REGISTER is refused, the cluster exits 1, fresh ones are spawned', async () => {
  const m = await startManager({ stateDir: false });
  managers.push(m);
  const before = await m.waitReady();
  const pids = before.clusters.map((cl) => cl.pid);
  await m.kill('SIGKILL');
  await m.start();
  const errors = await m.waitEvents({ ev: 'error' }, 2);
  for (const e of errors) {
    assert.equal(e.code, 'forbidden');
    assert.ok(pids.includes(e.pid));
  }
  for (const pid of pids) await waitExit(pid);
  const st = await m.waitReady();
  for (const cl of st.clusters) assert.ok(!pids.includes(cl.pid), 'a new process serves');
});
