// A cluster process under sm-manager (docs/protocol.md, "Clusters"): it
// registers with the identity the manager put in its environment, heartbeats
// with a ready flag, its stats and its shards' resume state, answers business
// ops, asks the identify gate, and follows the manager's lifecycle: ACTIVATE
// (start handling gateway events) and QUIESCE or SIGTERM (finish, send
// QUIESCED with the resume state and the handoff, exit).

import process from 'node:process';
import { SmError, Codes } from './errors.js';
import { checkSize } from './framing.js';
import { Link } from './link.js';
import { Peer, linkOptions, LOCAL_DEADLINE_GRACE_MS } from './peer.js';

/** The heartbeat interval when the REGISTER reply names none (an old manager). */
const FALLBACK_HEARTBEAT_MS = 1000;

/** How long QUIESCED waits for the manager's REPLY before the socket closes. */
const QUIESCED_REPLY_MS = 1000;

/** How long a quiesce that lost its connection waits to reconnect and send QUIESCED. */
const QUIESCE_RECONNECT_MS = 5000;

/**
 * The exit status of a process whose manager could not be reached for
 * SM_ORPHAN_TIMEOUT_MS (EX_TEMPFAIL), as cluster-harness exits.
 */
export const ORPHAN_EXIT_CODE = 75;

// SM_ORPHAN_TIMEOUT_MS: a positive integer, or absent (never orphaned).
function orphanTimeoutOf(o, env) {
  if (o.orphanTimeoutMs !== undefined) {
    if (!Number.isSafeInteger(o.orphanTimeoutMs) || o.orphanTimeoutMs < 0) {
      throw new SmError(Codes.BAD_CONFIG, 'orphanTimeoutMs must be a non-negative integer (0: never)');
    }
    return o.orphanTimeoutMs;
  }
  const v = envInt(env, 'SM_ORPHAN_TIMEOUT_MS');
  if (v === 0) throw new SmError(Codes.BAD_CONFIG, 'SM_ORPHAN_TIMEOUT_MS must be a positive integer');
  return v ?? 0;
}

// An SM_* integer: plain digits (absent: undefined, left out of REGISTER so
// that the manager answers bad_frame, as it does for any such REGISTER).
function envInt(env, name) {
  const v = env[name];
  if (v === undefined || v === '') return undefined;
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(Number(v))) {
    throw new SmError(Codes.BAD_CONFIG, `${name} must be a non-negative integer`);
  }
  return Number(v);
}

function optInt(v, name) {
  if (v === undefined) return undefined;
  if (!Number.isSafeInteger(v) || v < 0) throw new SmError(Codes.BAD_CONFIG, `${name} must be a non-negative integer`);
  return v;
}

function intOr(v, fallback) {
  return Number.isSafeInteger(v) ? v : fallback;
}

// The REGISTER reply's resume entries as @discordjs/ws SessionInfo, by shard.
// An older manager sends no shard_count: its entries are of the topology in
// force (at most resume_max_age old), and a RESUME Discord refuses costs one
// round trip before the library identifies.
function resumeMap(entries, totalShards) {
  const m = new Map();
  if (!Array.isArray(entries)) return m;
  for (const e of entries) {
    if (!e || !Number.isSafeInteger(e.shard) || typeof e.session_id !== 'string') continue;
    m.set(e.shard, {
      sessionId: e.session_id,
      sequence: Number.isSafeInteger(e.seq) ? e.seq : 0,
      resumeURL: typeof e.resume_url === 'string' ? e.resume_url : '',
      shardId: e.shard,
      shardCount: Number.isSafeInteger(e.shard_count) ? e.shard_count : totalShards,
    });
  }
  return m;
}

function gateOf(identify) {
  if (!identify || typeof identify !== 'object') return null;
  return {
    gate: identify.gate === true,
    maxConcurrency: intOr(identify.max_concurrency, 1),
    spacingMs: intOr(identify.spacing_ms, 5000),
  };
}

function wireError(err) {
  const code = typeof err?.code === 'string' && err.code !== '' ? err.code : Codes.HANDLER_ERROR;
  const message = typeof err?.message === 'string' ? err.message : String(err);
  return { code, message };
}

/**
 * A registered cluster process. Made by connect(); an EventEmitter with the
 * events 'activate' (handoff), 'quiesce' (source), 'quiesced', 'reconnect'
 * (REGISTER reply payload), 'disconnect' (error), 'warning' (SmError) and
 * 'error' (SmError, a refused re-REGISTER).
 */
export class Cluster extends Peer {
  constructor(o) {
    super(o);
    const env = o.env ?? process.env;
    this.socketPath = o.socket ?? env.SM_SOCKET;
    if (!this.socketPath) {
      throw new SmError(Codes.BAD_CONFIG, 'SM_SOCKET is not set: connect() is for a process sm-manager started (or pass {socket})');
    }
    this.id = optInt(o.cluster, 'cluster') ?? envInt(env, 'SM_CLUSTER');
    this.generation = optInt(o.generation, 'generation') ?? envInt(env, 'SM_GENERATION');
    this._token = o.token ?? env.SM_TOKEN ?? '';
    this._envShards = {
      first: envInt(env, 'SM_SHARD_FIRST'),
      last: envInt(env, 'SM_SHARD_LAST'),
      total: envInt(env, 'SM_TOTAL_SHARDS'),
    };
    this._heartbeatOverrideMs = o.heartbeatIntervalMs;
    this._exitOnQuiesce = o.exitOnQuiesce ?? true;
    this._exitOnRefused = o.exitOnRefused ?? true;
    this._handleSigterm = o.handleSigterm ?? true;
    // With [mesh] the manager sets SM_ORPHAN_TIMEOUT_MS: a process that
    // cannot reach it that long exits, before its lease passes to another host.
    this.orphanTimeoutMs = orphanTimeoutOf(o, env);
    this._exitOnOrphan = o.exitOnOrphan ?? true;
    this._orphanTimer = null;

    // From the REGISTER reply (see applyRegistration).
    this.shardFirst = undefined;
    this.shardLast = undefined;
    this.shardIds = [];
    this.totalShards = undefined;
    this.start = 'unknown';
    this.active = false;
    this.heartbeatIntervalMs = FALLBACK_HEARTBEAT_MS;
    this.heartbeatTimeoutMs = undefined;
    this.identifyGate = null;
    this.gateway = null;
    this.resume = new Map();
    this.registration = null;

    this.quiescing = false;
    this.handoff = undefined; // what QUIESCED carries (setHandoff)
    this._closed = false;

    this._ready = false;
    this._stats = undefined;
    this._sessions = new Map(); // shard -> wire resume entry
    this._handlers = new Map();
    this._activateFns = [];
    this._quiesceFns = [];
    this._inflight = new Set(); // promises of async handlers not yet answered
    this._beatTimer = null;
    this._activeWaiters = [];
    this._quiescePromise = null;
    this._warnedBigBeat = false;
    this._onSigterm = () => {
      this.quiesce('SIGTERM');
    };

    const lo = linkOptions(o, 30_000);
    if (this.orphanTimeoutMs > 0) {
      // A successor manager that is up in time must be found in time.
      const cap = Math.max(1, Math.floor(this.orphanTimeoutMs / 8));
      lo.backoff = { ...lo.backoff, maxMs: Math.min(lo.backoff.maxMs, cap), minMs: Math.min(lo.backoff.minMs, cap) };
    }
    this.link = new Link({
      ...lo,
      path: this.socketPath,
      register: () => this.registerFrame(),
      onFrame: (f, epoch) => this.onFrame(f, epoch),
      logger: this.logger,
    });
    this.link.on('registered', (payload, first) => this.onRegistered(payload, first));
    this.link.on('disconnect', (err) => {
      this.stopBeats();
      this.armOrphan();
      this.emit('disconnect', err);
    });
    this.link.on('refused', (err) => this.onRefused(err));
  }

  registerFrame() {
    const f = { role: 'cluster', token: this._token, pid: process.pid };
    if (this.id !== undefined) f.cluster = this.id;
    if (this.generation !== undefined) f.generation = this.generation;
    return f;
  }

  async open() {
    await this.link.start();
    if (this._handleSigterm) process.on('SIGTERM', this._onSigterm);
    return this;
  }

  // armOrphan starts the count of SM_ORPHAN_TIMEOUT_MS from the loss of the
  // connection; a registration in time stops it (onRegistered).
  armOrphan() {
    if (this.orphanTimeoutMs <= 0 || this._orphanTimer || this._closed) return;
    const lost = Date.now();
    this._orphanTimer = setTimeout(() => {
      this._orphanTimer = null;
      if (this._closed || this.link.connected) return;
      const err = new SmError(Codes.UNAVAILABLE,
        `the manager's socket could not be reached for ${Date.now() - lost} ms (SM_ORPHAN_TIMEOUT_MS ${this.orphanTimeoutMs}): another host may take this cluster over`);
      this.logger.error(`sm: orphaned: ${err.message}; exiting ${ORPHAN_EXIT_CODE}`);
      this.emit('orphaned', err);
      if (this._exitOnOrphan) process.exit(ORPHAN_EXIT_CODE);
    }, this.orphanTimeoutMs);
  }

  disarmOrphan() {
    if (this._orphanTimer) clearTimeout(this._orphanTimer);
    this._orphanTimer = null;
  }

  onRegistered(payload, first) {
    this.disarmOrphan();
    this.applyRegistration(payload ?? {}, first);
    this.startBeats();
    if (!first) {
      this.logger.info(`sm: re-registered cluster ${this.id} generation ${this.generation}`);
      this.emit('reconnect', payload);
    }
    // A process the manager recorded as activated gets no second ACTIVATE
    // (after a manager restart that may have lost the first one in flight).
    if (payload?.active === true && !this.active) this.activate(undefined);
  }

  applyRegistration(r, first) {
    this.registration = r;
    if (first) {
      this.id = intOr(r.cluster, this.id);
      this.generation = intOr(r.generation, this.generation);
      this.shardFirst = intOr(r.shard_first, this._envShards.first);
      this.shardLast = intOr(r.shard_last, this._envShards.last);
      this.totalShards = intOr(r.total_shards, this._envShards.total);
      const ids = [];
      if (this.shardFirst !== undefined && this.shardLast !== undefined) {
        for (let s = this.shardFirst; s <= this.shardLast; s++) ids.push(s);
      }
      this.shardIds = ids;
      const e = this._envShards;
      if ((e.first !== undefined && e.first !== this.shardFirst) || (e.last !== undefined && e.last !== this.shardLast)
        || (e.total !== undefined && e.total !== this.totalShards)) {
        this.logger.warn(`sm: the manager's shard range ${this.shardFirst}-${this.shardLast}/${this.totalShards} differs from the environment's ${e.first}-${e.last}/${e.total}; using the manager's`);
      }
      this.start = typeof r.start === 'string' ? r.start : 'unknown';
      this.resume = resumeMap(r.resume, this.totalShards);
    }
    this.heartbeatIntervalMs = this._heartbeatOverrideMs ?? (intOr(r.heartbeat_interval_ms, 0) > 0 ? r.heartbeat_interval_ms : FALLBACK_HEARTBEAT_MS);
    this.heartbeatTimeoutMs = intOr(r.heartbeat_timeout_ms, undefined);
    this.identifyGate = gateOf(r.identify);
    this.gateway = r.gateway && typeof r.gateway === 'object' ? r.gateway : null;
  }

  onRefused(err) {
    this.disarmOrphan();
    this.stopBeats();
    this._closed = true;
    this.logger.error(`sm: the manager refused this process's REGISTER (${err.code}: ${err.message})`);
    if (this.listenerCount('error') > 0) this.emit('error', err);
    if (this._exitOnRefused) process.exit(1);
  }

  // ---- frames from the manager

  onFrame(f, epoch) {
    switch (f.op) {
      case 'ACTIVATE':
        this.activate(f.handoff !== null && typeof f.handoff === 'object' ? f.handoff : undefined);
        return;
      case 'QUIESCE':
        this.quiesce('QUIESCE');
        return;
      case 'REPLY':
        this.strayReply(f);
        return;
      default:
        this.serve(f, epoch);
    }
  }

  serve(f, epoch) {
    const id = typeof f.id === 'string' && f.id !== '' ? f.id : undefined;
    const h = this._handlers.get(f.op);
    if (h === undefined) {
      if (id) this.replyError(epoch, id, { code: Codes.UNKNOWN_OP, message: `cluster ${this.id} does not handle op ${JSON.stringify(f.op)}` });
      return;
    }
    let r;
    try {
      r = h(f.payload, f);
    } catch (err) {
      if (id) this.replyError(epoch, id, wireError(err));
      return;
    }
    if (r !== null && typeof r === 'object' && typeof r.then === 'function') {
      // p never rejects: QUIESCED waits for it, and nothing else observes it.
      const p = Promise.resolve(r).then(
        (v) => { if (id) this.reply(epoch, id, v); },
        (err) => { if (id) this.replyError(epoch, id, wireError(err)); },
      ).catch((err) => this.logger.error(`sm: answering ${f.op} failed: ${err?.stack ?? err}`))
        .then(() => { this._inflight.delete(p); });
      this._inflight.add(p);
      return;
    }
    if (id) this.reply(epoch, id, r);
  }

  // A reply goes only on the connection its request came on: after a
  // reconnection the manager has already answered that request `unavailable`.
  reply(epoch, id, value) {
    if (epoch !== this.link.epoch || !this.link.connected) return;
    let body;
    try {
      body = value === undefined ? 'null' : JSON.stringify(value);
    } catch (err) {
      this.replyError(epoch, id, { code: Codes.HANDLER_ERROR, message: `reply payload cannot be encoded as JSON: ${err.message}` });
      return;
    }
    const s = `{"op":"REPLY","id":${JSON.stringify(id)},"payload":${body ?? 'null'}}`;
    try {
      checkSize(s, this.link.sendMax, 'REPLY');
    } catch (err) {
      this.replyError(epoch, id, err.toJSON());
      return;
    }
    this.link.write(s + '\n');
  }

  replyError(epoch, id, error) {
    if (epoch !== this.link.epoch || !this.link.connected) return;
    let message = error.message;
    if (Buffer.byteLength(message, 'utf8') > 512) message = message.slice(0, 512);
    this.link.write(JSON.stringify({ op: 'REPLY', id, error: { code: error.code, message } }) + '\n');
  }

  // ---- heartbeats

  startBeats() {
    this.stopBeats();
    this.beat();
    this._beatTimer = setInterval(() => this.beat(), this.heartbeatIntervalMs);
  }

  stopBeats() {
    if (this._beatTimer !== null) {
      clearInterval(this._beatTimer);
      this._beatTimer = null;
    }
  }

  beat() {
    if (!this.link.connected) return;
    const f = { op: 'HEARTBEAT', ready: this._ready };
    let stats = this._stats;
    if (typeof stats === 'function') {
      try {
        stats = stats();
      } catch (err) {
        this.logger.warn(`sm: the stats function threw, heartbeat sent without stats: ${err?.message ?? err}`);
        stats = undefined;
      }
    }
    if (stats !== undefined) f.payload = stats;
    if (this._sessions.size > 0) f.resume = [...this._sessions.values()];
    try {
      this.link.send(f);
    } catch (err) {
      // Over the frame limit (or not JSON): a heartbeat must still go, or the
      // manager takes the process for hung.
      if (!this._warnedBigBeat) {
        this._warnedBigBeat = true;
        this.logger.warn(`sm: heartbeat sent without its stats payload: ${err.message}`);
      }
      delete f.payload;
      try {
        this.link.send(f);
      } catch {
        delete f.resume;
        this.link.send(f);
      }
    }
  }

  /** Sets the heartbeat's ready flag; a change is sent at once. */
  setReady(ready = true) {
    const v = ready === true;
    if (v === this._ready) return;
    this._ready = v;
    this.beat();
  }

  /** Sets the heartbeat payload: a JSON value, or a function returning one per beat. */
  setStats(stats) {
    this._stats = stats;
  }

  /**
   * Records a shard's resume state (@discordjs/ws SessionInfo fields), sent
   * on every HEARTBEAT and on QUIESCED; null forgets it.
   */
  setSession(shardId, info) {
    if (!Number.isSafeInteger(shardId) || shardId < 0) throw new TypeError('sm: setSession needs a shard id');
    if (info === null || info === undefined) {
      this._sessions.delete(shardId);
      return;
    }
    if (typeof info.sessionId !== 'string' || info.sessionId === '') {
      throw new TypeError('sm: setSession needs info.sessionId');
    }
    this._sessions.set(shardId, {
      shard: shardId,
      shard_count: Number.isSafeInteger(info.shardCount) ? info.shardCount : this.totalShards,
      session_id: info.sessionId,
      seq: Number.isSafeInteger(info.sequence) ? info.sequence : 0,
      resume_url: typeof info.resumeURL === 'string' ? info.resumeURL : '',
    });
  }

  /** Sets what QUIESCED carries as `handoff` for the next generation (undefined: none). */
  setHandoff(handoff) {
    // The manager ignores a handoff that is not a JSON object.
    if (handoff !== undefined && (handoff === null || typeof handoff !== 'object' || Array.isArray(handoff))) {
      throw new TypeError('sm: setHandoff needs an object (or undefined for none)');
    }
    this.handoff = handoff;
  }

  // ---- requests

  /** Answers business op `op` with fn(payload, frame) (sync or async). */
  handle(op, fn) {
    if (typeof op !== 'string' || op === '') throw new TypeError('sm: handle needs an op name');
    if (typeof fn !== 'function') throw new TypeError('sm: handle needs a function');
    this._handlers.set(op, fn);
    return this;
  }

  /**
   * Asks the manager's identify gate for a slot for shardId; resolves
   * {granted, shard, bucket} when it is due (at once when the manager has no
   * gate). Rejects with SmError (budget_refused, timeout, forbidden,
   * cancelled, unavailable) or, when signal aborts first, with its reason
   * after sending IDENTIFY_CANCEL.
   */
  async identify(shardId, { signal, timeoutMs } = {}) {
    if (!Number.isSafeInteger(shardId) || shardId < 0) throw new TypeError('sm: identify needs a shard id');
    if (signal?.aborted) throw signal.reason;
    if (!this.identifyGate?.gate) return { granted: true, shard: shardId, bucket: null };
    const f = { op: 'IDENTIFY', shard: shardId };
    let local = 0;
    if (timeoutMs !== undefined) {
      if (!(timeoutMs > 0) || !Number.isFinite(timeoutMs)) throw new TypeError('sm: timeoutMs must be a positive number');
      f.timeout_ms = Math.ceil(timeoutMs);
      local = f.timeout_ms + LOCAL_DEADLINE_GRACE_MS;
    }
    const reply = await this.link.request(f, {
      timeoutMs: local,
      signal,
      // Withdraw the ask so that no grant spends a session start for nothing.
      onGiveUp: () => this.cancelIdentify(shardId),
      late: (rf) => {
        if (rf.payload?.granted === true) {
          this.logger.warn(`sm: an identify slot for shard ${shardId} was granted as its ask was withdrawn; it is spent`);
        }
      },
    });
    return reply.payload;
  }

  cancelIdentify(shardId) {
    this.link.request({ op: 'IDENTIFY_CANCEL', shard: shardId }, { timeoutMs: 10_000 }).then(
      (r) => this.logger.debug(`sm: IDENTIFY_CANCEL of shard ${shardId} withdrew ${r.payload?.withdrawn}`),
      (err) => this.logger.debug(`sm: IDENTIFY_CANCEL of shard ${shardId} failed: ${err.code ?? ''} ${err.message}`),
    );
  }

  // ---- lifecycle

  activate(handoff) {
    if (this._activateFns === null) return; // once per process
    this.active = true;
    const fns = this._activateFns ?? [];
    this._activateFns = null; // from now on onActivate calls at once
    this._activatedWith = handoff;
    for (const fn of fns) this.callActivate(fn, handoff);
    for (const w of this._activeWaiters) w(handoff);
    this._activeWaiters = [];
    this.emit('activate', handoff);
  }

  callActivate(fn, handoff) {
    try {
      fn(handoff);
    } catch (err) {
      this.logger.error(`sm: an onActivate function threw: ${err?.stack ?? err}`);
    }
  }

  /** Calls fn(handoff) once ACTIVATE comes, or at once if it came. */
  onActivate(fn) {
    if (typeof fn !== 'function') throw new TypeError('sm: onActivate needs a function');
    if (this._activateFns === null) this.callActivate(fn, this._activatedWith);
    else this._activateFns.push(fn);
    return this;
  }

  /** Resolves with the handoff (or undefined) once the process is active. */
  whenActive() {
    if (this._activateFns === null) return Promise.resolve(this._activatedWith);
    return new Promise((resolve) => this._activeWaiters.push(resolve));
  }

  /** Runs fn (awaited, in order of registration) on QUIESCE or SIGTERM. */
  onQuiesce(fn) {
    if (typeof fn !== 'function') throw new TypeError('sm: onQuiesce needs a function');
    this._quiesceFns.push(fn);
    return this;
  }

  /**
   * Quiesces as on the manager's QUIESCE: runs the onQuiesce functions, waits
   * for the handlers still answering, sends QUIESCED with the resume state
   * and the handoff, closes, and (exitOnQuiesce) exits 0. Idempotent.
   */
  quiesce(source = 'local') {
    this._quiescePromise ??= this.runQuiesce(source);
    return this._quiescePromise;
  }

  async runQuiesce(source) {
    this.quiescing = true;
    this.logger.info(`sm: quiescing (${source})`);
    this.emit('quiesce', source);
    for (const fn of this._quiesceFns) {
      try {
        await fn(source);
      } catch (err) {
        this.logger.error(`sm: an onQuiesce function threw: ${err?.stack ?? err}`);
      }
    }
    while (this._inflight.size > 0) await Promise.allSettled([...this._inflight]);
    if (!this._closed) await this.sendQuiesced();
    await this.close();
    this.emit('quiesced');
    if (this._exitOnQuiesce) process.exit(0);
  }

  async sendQuiesced() {
    if (!this.link.connected && !this.link.closed) {
      // The manager went away mid-quiesce: tell the next one, if it comes soon.
      await new Promise((resolve) => {
        const t = setTimeout(done, QUIESCE_RECONNECT_MS);
        function done() {
          clearTimeout(t);
          resolve();
        }
        this.link.once('registered', done);
      });
    }
    if (!this.link.connected) return;
    const f = { op: 'QUIESCED' };
    if (this._sessions.size > 0) f.resume = [...this._sessions.values()];
    if (this.handoff !== undefined) f.handoff = this.handoff;
    // QUIESCED over the frame limit would not count at all: shed the handoff,
    // then the resume state, rather than lose it.
    const fits = () => {
      try {
        checkSize(JSON.stringify({ ...f, id: 'zzzzzzzzzzzz' }), this.link.sendMax, 'QUIESCED');
        return true;
      } catch (err) {
        this.logger.warn(`sm: ${err.message}`);
        return false;
      }
    };
    for (const field of ['handoff', 'resume']) {
      if (field in f && !fits()) {
        this.logger.warn(`sm: QUIESCED sent without its ${field}`);
        delete f[field];
      }
    }
    try {
      await this.link.request(f, { timeoutMs: QUIESCED_REPLY_MS });
    } catch (err) {
      this.logger.warn(`sm: QUIESCED not confirmed: ${err.code ?? ''} ${err.message}`);
    }
  }

  /** Stops heartbeats and closes the connection; no reconnection, no exit. */
  async close() {
    this._closed = true;
    this.disarmOrphan();
    this.stopBeats();
    if (this._handleSigterm) process.removeListener('SIGTERM', this._onSigterm);
    await this.link.close();
  }
}

/**
 * Connects a cluster process to the manager from its SM_* environment
 * (options may override) and resolves once the REGISTER is answered.
 */
export async function connect(options = {}) {
  const c = new Cluster(options);
  try {
    return await c.open();
  } catch (err) {
    await c.close().catch(() => {});
    throw err;
  }
}
