// The deploy handoff between two generations of one cluster, as plain
// functions: what the old process records of the dispatches it handled, and
// which of its buffered dispatches the new process replays at ACTIVATE.
//
// Both generations hold a session of each shard during a deploy, and Discord
// sends every guild event to every session of its shard, so the new process's
// buffer overlaps what the old one handled. The old process puts the hashes of
// its last HANDOFF_DEPTH handled dispatches per shard into QUIESCED's
// `handoff`; the manager hands that object, unread, to the new process's
// ACTIVATE; the new process replays only what comes after the matching point.
//
// Format (version 1): {"v":1,"shards":{"<id>":{"last":["<hash>",…]}}}, oldest
// first, each hash FNV-1a 64 (16 hex digits) of the dispatch's `t` followed by
// the JSON of its `d`.

/** How many handled dispatches per shard the old process reports. */
export const HANDOFF_DEPTH = 16;

/** The handoff format's version. */
export const HANDOFF_VERSION = 1;

const encoder = new TextEncoder();

/**
 * FNV-1a 64 of a string's UTF-8 bytes, as 16 hex digits. Done in two 32-bit
 * halves: BigInt arithmetic would cost several times as much per byte.
 */
export function fnv1a64(str) {
  const bytes = encoder.encode(str);
  let hi = 0xcbf29ce4;
  let lo = 0x84222325;
  for (let i = 0; i < bytes.length; i++) {
    lo ^= bytes[i];
    // (hi,lo) *= 0x100000001b3 mod 2^64: lo*0x1b3 fits in 41 bits, and the
    // 2^40 term only touches hi, through the low 24 bits of lo.
    const l = (lo >>> 0) * 0x1b3;
    const carry = Math.floor(l / 0x100000000);
    hi = (Math.imul(hi, 0x1b3) + carry + ((lo << 8) >>> 0)) >>> 0;
    lo = l >>> 0;
  }
  return hi.toString(16).padStart(8, '0') + (lo >>> 0).toString(16).padStart(8, '0');
}

/** The handoff hash of a gateway dispatch payload ({t, d, …}). */
export function dispatchHash(payload) {
  return fnv1a64(String(payload.t) + JSON.stringify(payload.d ?? null));
}

/**
 * Builds the handoff object from the last handled dispatches per shard
 * (Map<shardId, payload[]>, oldest first; only the last HANDOFF_DEPTH count).
 */
export function buildHandoff(handledByShard) {
  const shards = {};
  for (const [shardId, payloads] of handledByShard) {
    if (!payloads.length) continue;
    shards[String(shardId)] = { last: payloads.slice(-HANDOFF_DEPTH).map(dispatchHash) };
  }
  return { v: HANDOFF_VERSION, shards };
}

/**
 * The hashes the old process reported for one shard, or null when the handoff
 * is absent, of another version, or says nothing valid about that shard.
 */
export function handoffFor(handoff, shardId) {
  if (!handoff || typeof handoff !== 'object' || handoff.v !== HANDOFF_VERSION) return null;
  const entry = handoff.shards?.[String(shardId)];
  if (!entry || !Array.isArray(entry.last)) return null;
  const last = entry.last.filter((h) => typeof h === 'string');
  return last.length ? last : null;
}

/**
 * Which buffered dispatches of one shard the new process must handle, given
 * their hashes (oldest first) and the old process's last handled hashes
 * (`last`, oldest first, or null). Returns a boolean per buffered entry.
 *
 * The match point p is the newest buffered entry equal to the newest hash of
 * `last` that the buffer holds, preferring one whose predecessors agree with
 * `last` as far as both go (so a payload that legitimately repeats is not
 * taken for the old process's last one). Entries after it are handled, except
 * those whose hash is in `last`. No match at all: everything is handled.
 *
 * Two sessions of a shard may get events of different guilds in a different
 * order, so an entry just before p that is not in `last` was not handled by
 * the old process either: entries after the earliest entry in `last` near p
 * (within 4 × last.length before it) are handled unless in `last`; entries up
 * to that one came before the old process's last handled ones and were
 * handled by it.
 */
export function replayMask(hashes, last) {
  const mask = new Array(hashes.length).fill(true);
  if (!last || !last.length || !hashes.length) return mask;
  const p = matchPoint(hashes, last);
  if (p < 0) return mask;
  const inLast = new Set(last);
  let q = p;
  for (let i = p - 1; i >= Math.max(0, p - 4 * last.length); i--) {
    if (inLast.has(hashes[i])) q = i;
  }
  for (let i = 0; i < hashes.length; i++) mask[i] = i > q && !inLast.has(hashes[i]);
  return mask;
}

// The index in hashes of the old process's last handled dispatch, or -1.
function matchPoint(hashes, last) {
  for (let k = last.length - 1; k >= 0; k--) {
    let plain = -1;
    for (let i = hashes.length - 1; i >= 0; i--) {
      if (hashes[i] !== last[k]) continue;
      if (plain < 0) plain = i;
      let agrees = true;
      for (let j = 1; j <= Math.min(k, i); j++) {
        if (hashes[i - j] !== last[k - j]) {
          agrees = false;
          break;
        }
      }
      if (agrees) return i;
    }
    if (plain >= 0) return plain;
  }
  return -1;
}
