// The deploy handoff and the dispatch gate, without a manager: the hash, the
// replay decision, and two gates fed the same stream the way a deploy's two
// generations are (the old one live, the new one buffering until ACTIVATE).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fnv1a64, dispatchHash, buildHandoff, handoffFor, replayMask, HANDOFF_DEPTH } from '../src/handoff.js';
import { DispatchGate } from '../src/discordjs.js';

test('fnv1a64 matches the FNV-1a 64 reference (BigInt) on ASCII and UTF-8', () => {
  const ref = (s) => {
    let h = 0xcbf29ce484222325n;
    for (const b of new TextEncoder().encode(s)) h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn;
    return h.toString(16).padStart(16, '0');
  };
  assert.equal(fnv1a64(''), 'cbf29ce484222325');
  assert.equal(fnv1a64('a'), 'af63dc4c8601ec8c');
  assert.equal(fnv1a64('foobar'), '85944171f73967e8');
  for (const s of ['MESSAGE_CREATE{"id":"1"}', 'héllo ✓ 🙂', 'x'.repeat(1000)]) assert.equal(fnv1a64(s), ref(s));
  assert.equal(dispatchHash({ t: 'X', d: { a: 1 }, s: 5 }), fnv1a64('X{"a":1}'), 'seq is not hashed');
  assert.equal(dispatchHash({ t: 'RESUMED', d: null }), fnv1a64('RESUMEDnull'));
});

test('buildHandoff keeps the last 16 per shard; handoffFor reads only version 1', () => {
  const payloads = Array.from({ length: 20 }, (_, i) => ({ t: 'E', d: { i } }));
  const h = buildHandoff(new Map([[3, payloads], [4, []]]));
  assert.equal(h.v, 1);
  assert.deepEqual(Object.keys(h.shards), ['3']);
  assert.equal(h.shards['3'].last.length, HANDOFF_DEPTH);
  assert.equal(h.shards['3'].last.at(-1), dispatchHash(payloads[19]));
  assert.deepEqual(handoffFor(JSON.parse(JSON.stringify(h)), 3), h.shards['3'].last);
  assert.equal(handoffFor(h, 4), null);
  assert.equal(handoffFor({ v: 2, shards: h.shards }, 3), null);
  assert.equal(handoffFor(undefined, 3), null);
  assert.equal(handoffFor({ v: 1, shards: { 3: { last: 'x' } } }, 3), null);
});

test('replayMask: after the match point, none of the old one\'s, everything when nothing matches', () => {
  const m = (hashes, last) => replayMask(hashes, last).map((x) => (x ? 1 : 0)).join('');
  assert.equal(m(['b', 'c', 'd', 'e'], ['a', 'b', 'c']), '0011');
  assert.equal(m(['x', 'y', 'b', 'c', 'd'], ['a', 'b', 'c']), '00001', 'older ones were handled');
  assert.equal(m(['d', 'e'], ['a', 'b', 'c']), '11', 'buffer starts after the old one stopped');
  assert.equal(m(['d', 'e'], null), '11');
  assert.equal(m([], ['a']), '');
  assert.equal(m(['b', 'd', 'c', 'e'], ['a', 'b', 'c']), '0101', 'reordered between sessions: d was not handled');
  // A payload that repeats: the occurrence whose predecessors agree wins.
  assert.equal(m(['b', 'c', 'z', 'c', 'd'], ['a', 'b', 'c']), '00101');
  // The newest of last is missing from the buffer: match on the one before.
  assert.equal(m(['a', 'b', 'd'], ['a', 'b', 'c']), '001');
});

const ev = (shard, n, t = 'MESSAGE_CREATE') => ({ op: 0, t, s: n, d: { id: `${shard}:${n}` } });

test('DispatchGate holds events until ACTIVATE, passes the session\'s own READY/RESUMED/GUILD_CREATEs at once', () => {
  const got = [];
  const gate = new DispatchGate((p, shard) => got.push(`${shard}/${p.t}/${p.d?.id ?? ''}`));
  gate.push(0, { op: 0, t: 'READY', s: 1, d: { guilds: [{ id: 'g1', unavailable: true }] } });
  gate.push(0, { op: 0, t: 'GUILD_CREATE', s: 2, d: { id: 'g1' } });
  gate.push(0, ev(0, 3));
  gate.push(0, { op: 0, t: 'GUILD_CREATE', s: 4, d: { id: 'g2' } }); // a guild joined: an event
  gate.push(1, { op: 0, t: 'RESUMED', s: 9, d: null });
  gate.push(1, ev(1, 10));
  assert.deepEqual(got, ['0/READY/', '0/GUILD_CREATE/g1', '1/RESUMED/']);
  assert.equal(gate.stats().buffered, 3);
  gate.activate(undefined);
  assert.deepEqual(got.slice(3), ['0/MESSAGE_CREATE/0:3', '0/GUILD_CREATE/g2', '1/MESSAGE_CREATE/1:10']);
  gate.push(1, ev(1, 11));
  assert.equal(got.at(-1), '1/MESSAGE_CREATE/1:11');
  assert.equal(gate.stats().replayed, 3);
  assert.equal(gate.stats().handled, 4);
  gate.activate(undefined); // a second ACTIVATE changes nothing
  assert.equal(gate.stats().handled, 4);
});

test('a deploy through two gates: every event handled exactly once, with the handoff passed as JSON', () => {
  for (const [cut, newStartsAt, reorder] of [[50, 10, false], [50, 49, false], [50, 50, false], [5, 0, false], [80, 30, true]]) {
    const handled = new Map();
    const count = (who) => (p) => handled.set(p.d.id, [...(handled.get(p.d.id) ?? []), who]);
    const oldGate = new DispatchGate(count('old'));
    oldGate.activate(undefined);
    const newGate = new DispatchGate(count('new'));
    const stream = Array.from({ length: 120 }, (_, i) => ev(0, i + 1));
    // The new session's copy of the stream starts later (its READY, always
    // before the QUIESCE: the old one is quiesced when the new one is ready) and may
    // have two neighbours swapped.
    const newStream = stream.slice(newStartsAt);
    if (reorder) [newStream[cut - newStartsAt - 1], newStream[cut - newStartsAt]] = [newStream[cut - newStartsAt], newStream[cut - newStartsAt - 1]];
    let handoff = null;
    for (let i = 0; i < stream.length; i++) {
      if (i === cut) handoff = JSON.parse(JSON.stringify(oldGate.stop())); // QUIESCE
      oldGate.push(0, stream[i]);
      if (i >= newStartsAt) newGate.push(0, newStream[i - newStartsAt]);
      if (i === cut + 7) newGate.activate(handoff); // ACTIVATE, a little later
    }
    const label = `cut ${cut}, new from ${newStartsAt}${reorder ? ', reordered' : ''}`;
    for (const p of stream) assert.equal(handled.get(p.d.id)?.length, 1, `${label}: ${p.d.id} handled by ${handled.get(p.d.id)}`);
    assert.equal(oldGate.stats().afterQuiesce, stream.length - cut);
  }
});

test('DispatchGate reports handler errors (thrown or rejected) and keeps going; overflow drops the oldest', async () => {
  const errors = [];
  const gate = new DispatchGate((p) => {
    if (p.d.id === '0:1') throw new Error('sync');
    if (p.d.id === '0:2') return Promise.reject(new Error('async'));
    return undefined;
  }, { onError: (e) => errors.push(e.message), maxBuffered: 3 });
  for (let n = 1; n <= 5; n++) gate.push(0, ev(0, n));
  assert.equal(gate.stats().overflow, 2);
  gate.activate(undefined);
  gate.push(0, ev(0, 1));
  gate.push(0, ev(0, 2));
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(errors, ['sync', 'async']);
  assert.equal(gate.stats().handled, 5);
});
