// What clusters and clients share: business requests by target, broadcast,
// fire-and-forget, deadlines, options and the logger. Any registered peer may
// send business ops (docs/protocol.md, "Business ops").

import { EventEmitter } from 'node:events';
import { SmError, Codes } from './errors.js';
import { DEFAULT_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES } from './framing.js';
import { DEFAULT_BACKOFF } from './link.js';

/** The manager's default requests.timeout, used when a request names none. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 10_000;

/**
 * How much longer than the deadline sent as timeout_ms the local timer waits:
 * the manager's answer at its deadline says more (`timeout` for a request a
 * cluster did not answer, `unavailable` for one never forwarded), so it should
 * arrive first; the local timer is for a manager that answers nothing.
 */
export const LOCAL_DEADLINE_GRACE_MS = 250;

// Op names the manager handles itself; request()/send() would not reach a cluster.
const RESERVED_OPS = new Set([
  'REGISTER', 'HEARTBEAT', 'QUIESCE', 'QUIESCED', 'DEPLOY', 'ACTIVATE', 'REPLY',
  'STATUS', 'WATCH', 'EVENT', 'IDENTIFY', 'IDENTIFY_CANCEL',
]);

const SILENT = Object.freeze({ debug() {}, info() {}, warn() {}, error() {} });

const STDERR = Object.freeze({
  debug() {},
  info() {},
  warn: (msg) => console.error(msg),
  error: (msg) => console.error(msg),
});

/** A logger with all four methods from what the caller gave (null: silent). */
export function makeLogger(logger) {
  if (logger === null) return SILENT;
  if (logger === undefined) return STDERR;
  const pick = (name, ...fallbacks) => {
    for (const n of [name, ...fallbacks]) {
      if (typeof logger[n] === 'function') return logger[n].bind(logger);
    }
    return () => {};
  };
  return { debug: pick('debug'), info: pick('info', 'log'), warn: pick('warn', 'error'), error: pick('error', 'warn') };
}

/** Link options shared by clusters and clients, from the caller's options. */
export function linkOptions(o, connectTimeoutMs) {
  const max = o.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
  if (!Number.isInteger(max) || max < MIN_MAX_FRAME_BYTES) {
    throw new SmError(Codes.BAD_CONFIG, `maxFrameBytes must be an integer of at least ${MIN_MAX_FRAME_BYTES}`);
  }
  return {
    maxFrameBytes: max,
    backoff: { ...DEFAULT_BACKOFF, ...(o.backoff ?? {}) },
    registerTimeoutMs: o.registerTimeoutMs ?? 10_000,
    connectTimeoutMs: o.connectTimeoutMs ?? connectTimeoutMs,
    reconnect: o.reconnect ?? true,
  };
}

/** The wire target for a cluster id (number) or a target string. */
export function wireTarget(target) {
  if (typeof target === 'number') {
    if (!Number.isSafeInteger(target) || target < 0) {
      throw new TypeError(`sm: target ${target} is not a cluster id (a non-negative integer)`);
    }
    return String(target);
  }
  if (typeof target !== 'string') {
    throw new TypeError("sm: target must be a cluster id or a string such as '3', 'shard:5', 'guild:<id>' or '*'");
  }
  return target;
}

function checkOp(op) {
  if (typeof op !== 'string' || op === '') throw new TypeError('sm: op must be a non-empty string');
  if (RESERVED_OPS.has(op)) throw new TypeError(`sm: ${op} is handled by the manager, not a business op`);
}

function positive(ms, what) {
  if (ms === undefined || ms === null) return undefined;
  if (typeof ms !== 'number' || !(ms > 0) || !Number.isFinite(ms)) {
    throw new TypeError(`sm: ${what} must be a positive number of milliseconds`);
  }
  return Math.ceil(ms);
}

/** Base of Cluster and Client: one Link and the business-op calls. */
export class Peer extends EventEmitter {
  constructor(o) {
    super();
    this.logger = makeLogger(o.logger);
    this.requestTimeoutMs = positive(o.requestTimeoutMs, 'requestTimeoutMs') ?? DEFAULT_REQUEST_TIMEOUT_MS;
    this.link = null; // set by the subclass
  }

  /** Whether the peer is registered right now. */
  get connected() {
    return this.link !== null && this.link.connected;
  }

  // Sends a request with a deadline: timeout_ms to the manager, and a local
  // timer a little later.
  call(frame, opts = {}) {
    const ms = positive(opts.timeoutMs, 'timeoutMs') ?? this.requestTimeoutMs;
    frame.timeout_ms = ms;
    return this.link.request(frame, { timeoutMs: ms + LOCAL_DEADLINE_GRACE_MS, signal: opts.signal });
  }

  /**
   * Sends a business op to target and resolves with the cluster's reply
   * payload (null when it had none); rejects with SmError.
   */
  async request(target, op, payload, opts) {
    checkOp(op);
    const f = { op, target: wireTarget(target) };
    if (payload !== undefined) f.payload = payload;
    const reply = await this.call(f, opts);
    return reply.payload ?? null;
  }

  /**
   * Sends a business op to every cluster; resolves with one result per
   * cluster, in cluster order: {cluster, payload} or {cluster, error} (an
   * SmError). The whole broadcast rejects only when the manager refuses it.
   */
  async broadcast(op, payload, opts) {
    checkOp(op);
    const f = { op, target: '*' };
    if (payload !== undefined) f.payload = payload;
    const reply = await this.call(f, opts);
    const results = reply.payload?.results;
    if (!Array.isArray(results)) {
      throw new SmError(Codes.INTERNAL, 'broadcast REPLY without a results array');
    }
    return results.map((r) => (r.error != null
      ? { cluster: r.cluster, error: SmError.from(r.error) }
      : { cluster: r.cluster, payload: r.payload ?? null }));
  }

  /**
   * Sends a business op with no id: no reply, and no error back unless the
   * manager finds one in the frame itself (unknown_target, ...), which comes
   * as a 'warning' event. Returns false when not connected (the frame is
   * dropped).
   */
  send(target, op, payload) {
    checkOp(op);
    const f = { op, target: wireTarget(target) };
    if (payload !== undefined) f.payload = payload;
    return this.link.send(f);
  }

  // A REPLY no request of ours waits for. With an id: late (after our local
  // deadline or abort), dropped. Without: the manager's error notice about a
  // frame of ours (a fire-and-forget's unknown_target, a late reply's
  // unknown_id, frame_too_large, bad_frame).
  strayReply(f) {
    if (typeof f.id === 'string' && f.id !== '') {
      this.logger.debug(`sm: dropped a REPLY to request ${f.id}, no longer awaited`);
      return;
    }
    if (f.error != null) {
      const err = SmError.from(f.error);
      this.logger.warn(`sm: the manager reports ${err.code}: ${err.message}`);
      if (this.listenerCount('warning') > 0) this.emit('warning', err);
    }
  }
}
