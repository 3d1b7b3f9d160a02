// NDJSON framing of protocol v1 (docs/protocol.md, "Transport"): one JSON
// object per line, a size limit that counts the line's bytes without its
// newline, blank lines skipped, an oversized line skipped up to its newline so
// the stream never goes out of step. Pure code, no I/O: the link feeds it.

import { SmError, Codes } from './errors.js';

/** The manager's default limits.max_frame_bytes (1 MiB). */
export const DEFAULT_MAX_FRAME_BYTES = 1 << 20;

/** The smallest limit the manager accepts. */
export const MIN_MAX_FRAME_BYTES = 1024;

// UTF-8 bytes of a string. A UTF-16 unit is 1 to 3 bytes (a surrogate pair, two
// units, is 4), so the length bounds it both ways and most frames skip the count.
function overLimit(s, max) {
  if (s.length > max) return true;
  if (s.length * 3 <= max) return false;
  return Buffer.byteLength(s, 'utf8') > max;
}

// Only JSON whitespace counts as blank, as in the manager's reader.
function isBlank(s) {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c !== 0x20 && c !== 0x09 && c !== 0x0d && c !== 0x0a) return false;
  }
  return true;
}

/**
 * Splits a stream of decoded text into frame lines. Feed it strings from a
 * socket set to UTF-8 (the decoder keeps multi-byte characters whole across
 * chunks); it calls onLine(line) per non-blank line within the limit and
 * onOversize() once per line over it.
 */
export class LineSplitter {
  constructor(maxFrameBytes, onLine, onOversize) {
    this.max = maxFrameBytes;
    this.onLine = onLine;
    this.onOversize = onOversize;
    this.partial = '';
    this.skipping = false; // inside an oversized line, until its newline
  }

  push(chunk) {
    let start = 0;
    if (this.skipping) {
      const nl = chunk.indexOf('\n');
      if (nl < 0) return;
      this.skipping = false;
      start = nl + 1;
    }
    for (;;) {
      const nl = chunk.indexOf('\n', start);
      if (nl < 0) break;
      let line = chunk.slice(start, nl);
      start = nl + 1;
      if (this.partial !== '') {
        line = this.partial + line;
        this.partial = '';
      }
      if (overLimit(line, this.max)) {
        this.onOversize();
        continue;
      }
      if (line.length === 0 || isBlank(line)) continue;
      this.onLine(line);
    }
    if (start < chunk.length) {
      this.partial += chunk.slice(start);
      if (overLimit(this.partial, this.max)) {
        this.partial = '';
        this.skipping = true;
        this.onOversize();
      }
    }
  }

  /** Whether a line was cut off by the end of the stream (it is lost). */
  get pending() {
    return this.partial !== '' && !isBlank(this.partial);
  }
}

/**
 * Parses one line into a frame object. It throws SmError bad_frame for a
 * line that is not a JSON object or has no string op.
 */
export function decodeFrame(line) {
  let f;
  try {
    f = JSON.parse(line);
  } catch (err) {
    throw new SmError(Codes.BAD_FRAME, `not a JSON frame: ${err.message}`);
  }
  if (f === null || typeof f !== 'object' || Array.isArray(f)) {
    throw new SmError(Codes.BAD_FRAME, 'frame is not a JSON object');
  }
  if (typeof f.op !== 'string' || f.op === '') {
    throw new SmError(Codes.BAD_FRAME, 'frame has no op');
  }
  return f;
}

/**
 * Encodes a frame object as one line with its newline. It throws SmError
 * frame_too_large when the object is over maxFrameBytes (the manager would
 * refuse it, and a frame with an id would never be answered), and
 * SmError bad_frame when it cannot be serialized (a BigInt, a cycle).
 */
export function encodeFrame(frame, maxFrameBytes) {
  let s;
  try {
    s = JSON.stringify(frame);
  } catch (err) {
    throw new SmError(Codes.BAD_FRAME, `cannot encode ${frame.op} frame: ${err.message}`);
  }
  checkSize(s, maxFrameBytes, frame.op);
  return s + '\n';
}

/** Throws SmError frame_too_large when the encoded frame s is over the limit. */
export function checkSize(s, maxFrameBytes, op) {
  if (overLimit(s, maxFrameBytes)) {
    throw new SmError(
      Codes.FRAME_TOO_LARGE,
      `${op} frame of ${Buffer.byteLength(s, 'utf8')} bytes exceeds max_frame_bytes (${maxFrameBytes})`,
    );
  }
}
