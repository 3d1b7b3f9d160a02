// What a real sm-manager never does, so the package's answers to it are
// tested against a scripted peer on a real Unix socket: a manager that does
// not answer (the local deadline), one that sends a frame over the limit, a
// REPLY nobody waits for, a retryable and a final REGISTER refusal.

import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { connectClient, SmError, LOCAL_DEADLINE_GRACE_MS } from '../src/index.js';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sm-node-link-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));
let n = 0;

// A peer on a fresh socket; onFrame(frame, write, conn) gets every frame.
async function scriptedManager(onFrame) {
  const socket = path.join(dir, `m${n++}.sock`);
  const frames = [];
  const conns = new Set();
  const server = net.createServer((c) => {
    conns.add(c);
    c.on('close', () => conns.delete(c));
    let buf = '';
    c.setEncoding('utf8');
    c.on('data', (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const f = JSON.parse(buf.slice(0, i));
        buf = buf.slice(i + 1);
        frames.push(f);
        onFrame(f, (obj) => c.write((typeof obj === 'string' ? obj : JSON.stringify(obj)) + '\n'), c);
      }
    });
  });
  await new Promise((resolve) => server.listen(socket, resolve));
  return {
    socket,
    frames,
    close: () => new Promise((resolve) => {
      for (const c of conns) c.destroy();
      server.close(resolve);
    }),
  };
}

const hello = (f, write) => {
  if (f.op === 'REGISTER') write({ op: 'REPLY', id: f.id, payload: { clusters: 1, conn: 1, protocol: 1, shards_per_cluster: 1, total_shards: 1 } });
};

test('a manager that never answers: the local timer ends the request soon after timeout_ms', async () => {
  const m = await scriptedManager(hello);
  const c = await connectClient({ socket: m.socket, logger: null });
  const warnings = [];
  c.on('warning', (w) => warnings.push(w));
  const t0 = Date.now();
  await assert.rejects(c.request(0, 'ping', null, { timeoutMs: 100 }), (e) => e instanceof SmError && e.code === 'timeout');
  assert.ok(Date.now() - t0 >= 100 + LOCAL_DEADLINE_GRACE_MS - 5, 'the manager is given its own deadline first');
  const sent = m.frames.find((f) => f.op === 'ping');
  assert.equal(sent.timeout_ms, 100, 'the deadline goes to the manager too');
  assert.equal(sent.target, '0');
  // Without timeoutMs the default deadline (requests.timeout's default) is sent.
  c.request('shard:0', 'ping').catch(() => {});
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(m.frames.at(-1).timeout_ms, 10_000);
  await c.close();
  await m.close();
  assert.deepEqual(warnings, []);
});

test('a frame over maxFrameBytes from the manager is skipped; the next one is read', async () => {
  const m = await scriptedManager((f, write) => {
    hello(f, write);
    if (f.op === 'echo') {
      write({ op: 'REPLY', id: f.id, payload: 'z'.repeat(2000) });
      write({ op: 'REPLY', id: f.id, payload: 'small' });
    }
  });
  const c = await connectClient({ socket: m.socket, logger: null, maxFrameBytes: 1024 });
  assert.equal(await c.request(0, 'echo'), 'small');
  await assert.rejects(c.request(0, 'echo', 'q'.repeat(1100)), (e) => e.code === 'frame_too_large');
  assert.equal(m.frames.filter((f) => f.op === 'echo').length, 1, 'an oversized request is not sent');
  await c.close();
  await m.close();
});

test("a REPLY without id is the manager's notice: a 'warning' event", async () => {
  const m = await scriptedManager((f, write) => {
    hello(f, write);
    if (f.op === 'note') write({ op: 'REPLY', error: { code: 'unknown_target', message: 'no such target' } });
  });
  const c = await connectClient({ socket: m.socket, logger: null });
  const warned = new Promise((resolve) => c.once('warning', resolve));
  assert.equal(c.send('nowhere', 'note', { x: 1 }), true);
  const w = await warned;
  assert.ok(w instanceof SmError);
  assert.equal(w.code, 'unknown_target');
  assert.equal(m.frames.at(-1).id, undefined, 'fire-and-forget carries no id');
  await c.close();
  await m.close();
});

test('REGISTER refused with busy is retried; refused with forbidden is final', async () => {
  let registers = 0;
  const m = await scriptedManager((f, write, conn) => {
    if (f.op !== 'REGISTER') return;
    registers++;
    if (registers <= 2) {
      write({ op: 'REPLY', id: f.id, error: { code: 'busy', message: 'too many' } });
      conn.end();
      return;
    }
    hello(f, write);
  });
  const c = await connectClient({ socket: m.socket, logger: null });
  assert.equal(registers, 3);
  assert.equal(c.totalShards, 1);
  await c.close();
  await m.close();

  const f = await scriptedManager((fr, write) => {
    if (fr.op === 'REGISTER') write({ op: 'REPLY', id: fr.id, error: { code: 'forbidden', message: 'no' } });
  });
  await assert.rejects(connectClient({ socket: f.socket, logger: null }), (e) => e.code === 'forbidden' && e.message === 'no');
  assert.equal(f.frames.length, 1, 'not retried');
  await f.close();
});

test('no manager at the socket: connect gives up after connectTimeoutMs with unavailable', async () => {
  await assert.rejects(
    connectClient({ socket: path.join(dir, 'nobody.sock'), logger: null, connectTimeoutMs: 200 }),
    (e) => e.code === 'unavailable' && /ENOENT/.test(e.message),
  );
});

test("the manager's max_frame_bytes from the REGISTER reply bounds what is sent", async () => {
  const m = await scriptedManager((f, write) => {
    if (f.op === 'REGISTER') {
      write({ op: 'REPLY', id: f.id, payload: { conn: 1, protocol: 1, max_frame_bytes: 2048 } });
      return;
    }
    if (f.op === 'echo') write({ op: 'REPLY', id: f.id, payload: f.payload });
  });
  const c = await connectClient({ socket: m.socket, logger: null }); // 1 MiB of its own
  try {
    assert.equal(await c.request(0, 'echo', 'q'.repeat(1500)), 'q'.repeat(1500));
    await assert.rejects(c.request(0, 'echo', 'q'.repeat(3000)), (e) => e.code === 'frame_too_large');
    assert.equal(m.frames.filter((f) => f.op === 'echo').length, 1, 'a request over the manager\'s limit is not sent');
  } finally {
    await c.close();
    await m.close();
  }
});
