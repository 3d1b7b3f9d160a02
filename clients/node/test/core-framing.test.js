// The NDJSON framing and the reconnection backoff: pure code, tested without I/O.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LineSplitter, decodeFrame, encodeFrame } from '../src/framing.js';
import { backoffDelay, DEFAULT_BACKOFF } from '../src/link.js';
import { SmError } from '../src/index.js';

function split(max, chunks) {
  const lines = [];
  let oversize = 0;
  const s = new LineSplitter(max, (l) => lines.push(l), () => oversize++);
  for (const c of chunks) s.push(c);
  return { lines, oversize, pending: s.pending };
}

test('lines split across chunks, blank lines skipped, \\r kept for JSON.parse', () => {
  const r = split(1024, ['{"op":"A"}\n{"op"', ':"B"}\r\n', '  \n\t\r\n', '\n{"op":"C"}\n{"op":"D"']);
  assert.deepEqual(r.lines, ['{"op":"A"}', '{"op":"B"}\r', '{"op":"C"}']);
  assert.equal(r.oversize, 0);
  assert.equal(r.pending, true, 'a line without its newline is not a frame');
  assert.equal(decodeFrame(r.lines[1]).op, 'B');
});

test('the limit counts UTF-8 bytes without the newline', () => {
  const max = 1024;
  const exact = `{"op":"${'é'.repeat(507)}x"}`; // 9 + 2·507 + 1 bytes: é is 2
  assert.equal(Buffer.byteLength(exact), max);
  const over = `{"op":"${'é'.repeat(507)}xx"}`;
  const r = split(max, [exact + '\n', over + '\n', '{"op":"after"}\n']);
  assert.deepEqual(r.lines, [exact, '{"op":"after"}']);
  assert.equal(r.oversize, 1);
});

test('an oversized line is skipped up to its newline, however it is chunked', () => {
  const big = 'x'.repeat(3000);
  const r = split(1024, ['{"op":"a"}\n{"p":"', big.slice(0, 1500), big.slice(1500), '"}\n{"op":"b"}\n']);
  assert.deepEqual(r.lines, ['{"op":"a"}', '{"op":"b"}']);
  assert.equal(r.oversize, 1);
});

test('decodeFrame refuses what is not a frame', () => {
  for (const bad of ['hello', '[1]', '"op"', 'null', '{"id":"1"}', '{"op":""}', '{"op":5}']) {
    assert.throws(() => decodeFrame(bad), (e) => e instanceof SmError && e.code === 'bad_frame', bad);
  }
  assert.deepEqual(decodeFrame('{"op":"REPLY","id":"1","payload":[1]}'), { op: 'REPLY', id: '1', payload: [1] });
});

test('encodeFrame refuses frames over the limit and values JSON cannot hold', () => {
  assert.equal(encodeFrame({ op: 'x' }, 1024), '{"op":"x"}\n');
  assert.throws(() => encodeFrame({ op: 'x', payload: 'y'.repeat(1100) }, 1024), (e) => e.code === 'frame_too_large');
  assert.throws(() => encodeFrame({ op: 'x', payload: 1n }, 1024), (e) => e.code === 'bad_frame');
});

test('backoff doubles from 50 ms to a 5 s ceiling, spread by ±20%', () => {
  const p = DEFAULT_BACKOFF;
  assert.equal(backoffDelay(p, 0, 0.5), 50);
  assert.equal(backoffDelay(p, 3, 0.5), 400);
  assert.equal(backoffDelay(p, 20, 0.5), 5000);
  assert.equal(backoffDelay(p, 5000, 0.5), 5000, 'no overflow to Infinity');
  assert.equal(backoffDelay(p, 0, 0), 40);
  assert.equal(backoffDelay(p, 20, 0.999999), 6000);
  assert.equal(backoffDelay({ minMs: 0, maxMs: 10, jitter: 0.2 }, 4, 0.3), 0);
});
