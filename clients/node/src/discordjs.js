// @sm-supervisor/client/discordjs: what a bot built on @discordjs/ws (2.x) or
// discord.js 14's Client needs to run under sm-manager, as hooks the library
// already has. Nothing here imports either library: they are the bot's.
//
//   identifyThrottler(cluster)        buildIdentifyThrottler: asks the manager's gate
//   sessionStore(cluster)             retrieveSessionInfo / updateSessionInfo: the
//                                     manager's resume store
//   webSocketManagerOptions(cluster)  all of the above, the shard range, and the
//                                     gateway information from the REGISTER reply
//   attach(cluster, manager, fn)      dispatches buffered until ACTIVATE, the deploy
//                                     handoff, the ready flag, QUIESCE
//   clientOptions(cluster, {buildStrategy})  the same for discord.js 14's Client
//
// Seams used, checked against the libraries' source (@discordjs/ws 2.0.4 and
// the 1.2.3 bundled with discord.js 14.28.1):
// - WebSocketManager takes no gateway-information option: fetchGatewayInformation()
//   calls options.rest.get(Routes.gatewayBot()) ('/gateway/bot'), so `rest` is a
//   small object that answers that route from the manager and passes every
//   other call to the bot's own REST, if given.
// - A shard RESUMEs only when retrieveSessionInfo's `shardCount` equals the
//   manager's shard count, so the store keeps it.
// - WebSocketShard#destroy closes with options.code, else 1000 (Discord ends
//   the session) or 4200 (CloseCodes.Resuming) when recovering; QUIESCE closes
//   with 4200 so the sessions stay resumable. destroy() also calls
//   updateSessionInfo(shardId, null) unless recovering, which the store
//   ignores once QUIESCE has begun so that QUIESCED still reports them.
// - A waitForIdentify that rejects without its signal aborted makes the shard
//   destroy itself and then send an IDENTIFY anyway; so the throttler only
//   rejects on abort, and waits out every refusal instead.
// - discord.js 14 passes only ws.buildIdentifyThrottler and ws.buildStrategy
//   to its @discordjs/ws, and its own session hooks; buildStrategy(manager)
//   runs in the WebSocketManager's constructor, after manager.options is set
//   and before anything reads it, so clientOptions' buildStrategy swaps the
//   hooks and `rest` there and wraps manager.emit to gate dispatches.

import { buildHandoff, dispatchHash, handoffFor, replayMask, HANDOFF_DEPTH } from './handoff.js';

export { HANDOFF_DEPTH, dispatchHash } from './handoff.js';

/** The close code that keeps a session resumable (@discordjs/ws CloseCodes.Resuming). */
export const RESUMABLE_CLOSE_CODE = 4200;

/** Identify spacing used when the manager has no gate (an older manager). */
const LOCAL_SPACING_MS = 5500;

const GATEWAY_BOT_ROUTE = '/gateway/bot';

// One store and one throttler per cluster handle, however many helpers ask.
const stores = new WeakMap();
const throttlers = new WeakMap();

// The manager's gate settings from the REGISTER reply ({gate,
// maxConcurrency, spacingMs}), or null when it has no gate (an older manager).
function gateSettings(cluster) {
  return cluster.identifyGate ?? null;
}

function abortableSleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = ms === Infinity ? undefined : setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function warn(log, msg) {
  if (log && typeof log.warn === 'function') log.warn(msg);
}

/**
 * The resume store for @discordjs/ws's retrieveSessionInfo/updateSessionInfo:
 * seeded from the REGISTER reply's resume entries (only those whose shard
 * count matches the topology; none for a deploy candidate, which must not
 * take over the sessions of the process still serving), and reporting every
 * update to the manager with cluster.setSession, which sends it on each
 * HEARTBEAT and on QUIESCED.
 */
export function sessionStore(cluster) {
  let store = stores.get(cluster);
  if (!store) {
    store = new SessionStore(cluster);
    stores.set(cluster, store);
  }
  return store;
}

class SessionStore {
  constructor(cluster) {
    this.cluster = cluster;
    this.sessions = new Map();
    this.frozen = false;
    if (cluster.start !== 'candidate' && cluster.resume) {
      const own = new Set(cluster.shardIds);
      for (const [shardId, info] of cluster.resume) {
        if (!own.has(shardId) || info.shardCount !== cluster.totalShards) continue;
        this.sessions.set(shardId, { ...info, shardId });
      }
    }
    this.retrieveSessionInfo = this.retrieveSessionInfo.bind(this);
    this.updateSessionInfo = this.updateSessionInfo.bind(this);
  }

  /** The session to RESUME for a shard, or null to IDENTIFY. */
  retrieveSessionInfo(shardId) {
    return this.sessions.get(shardId) ?? null;
  }

  /** Records a shard's session (null: the session ended). */
  updateSessionInfo(shardId, info) {
    if (!info) {
      // Shutting down: the library forgets its sessions; the manager keeps them.
      if (this.frozen || this.cluster.quiescing) return;
      this.sessions.delete(shardId);
      this.cluster.setSession(shardId, null);
      return;
    }
    this.sessions.set(shardId, info);
    this.cluster.setSession(shardId, {
      sessionId: info.sessionId, sequence: info.sequence, resumeURL: info.resumeURL, shardCount: info.shardCount,
    });
  }

  /** From now on keep every session (QUIESCE has begun). */
  freeze() {
    this.frozen = true;
  }
}

/**
 * An identify throttler for @discordjs/ws's buildIdentifyThrottler:
 * waitForIdentify(shardId, signal) resolves when the manager grants the
 * shard a slot (cluster.identify, which withdraws the ask if the signal
 * aborts). It rejects only when the signal aborts; a refusal is waited out
 * (`budget_refused`: retryMs; a timeout: at once; quiescing: until the
 * library gives up), since @discordjs/ws would IDENTIFY anyway after any
 * other rejection. Without a gate (an older manager) it spaces identifies
 * per bucket itself, 5.5 s apart.
 */
export function identifyThrottler(cluster, { retryMs = 30_000, logger } = {}) {
  let t = throttlers.get(cluster);
  if (t) return t;
  const log = logger ?? cluster.logger;
  const local = new Map(); // bucket -> time its next identify may go
  t = {
    async waitForIdentify(shardId, signal) {
      const gate = gateSettings(cluster);
      if (!gate?.gate) {
        const mc = Math.max(1, gate?.maxConcurrency ?? cluster.gateway?.session_start_limit?.max_concurrency ?? 1);
        const bucket = shardId % mc;
        const now = Date.now();
        const at = Math.max(now, local.get(bucket) ?? 0);
        local.set(bucket, at + LOCAL_SPACING_MS);
        await abortableSleep(at - now, signal);
        return;
      }
      for (;;) {
        if (signal?.aborted) throw signal.reason;
        try {
          await cluster.identify(shardId, { signal });
          return;
        } catch (err) {
          if (signal?.aborted) throw signal.reason ?? err;
          const code = err?.code;
          if (code === 'timeout') continue;
          if (code === 'forbidden' && cluster.quiescing) {
            await abortableSleep(Infinity, signal); // never identify again
          }
          const wait = code === 'unavailable' ? 1000 : retryMs;
          warn(log, `sm: identify of shard ${shardId} refused (${code ?? 'error'}: ${err?.message ?? err}); asking again in ${wait} ms`);
          await abortableSleep(wait, signal);
        }
      }
    },
  };
  throttlers.set(cluster, t);
  return t;
}

/**
 * What GET /gateway/bot would answer, from the manager's REGISTER reply
 * (its `remaining` counts the shards that will RESUME, so @discordjs/ws's
 * "not enough sessions remaining" check does not stop a process that
 * resumes). Throws when the manager has no answer (it has no token).
 */
export function gatewayInformation(cluster) {
  const g = cluster.gateway;
  if (!g) {
    throw new Error('sm: the manager has no gateway information (no discord token configured); pass your own `rest` to let the library ask Discord');
  }
  return structuredClone(g);
}

/**
 * A `rest` for WebSocketManager: GET /gateway/bot is answered from the
 * manager (so no cluster asks Discord), every other request goes to `rest`.
 */
export function gatewayRest(cluster, rest) {
  return new Proxy(rest ?? {}, {
    get(target, prop) {
      if (prop === 'get') {
        return async (route, ...args) => {
          if (route === GATEWAY_BOT_ROUTE && (cluster.gateway || !rest)) return gatewayInformation(cluster);
          if (!rest) throw new Error(`sm: no REST client for GET ${route}; pass \`rest\``);
          return rest.get(route, ...args);
        };
      }
      const v = Reflect.get(target, prop, target);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}

/**
 * Options for @discordjs/ws's WebSocketManager: this process's shard ids and
 * the total shard count, the manager's resume store and identify gate, and a
 * `rest` that answers /gateway/bot from the manager. `extra` is merged under
 * them (token, intents, …); `extra.rest`, if given, serves every other route.
 */
export function webSocketManagerOptions(cluster, extra = {}) {
  const { rest, ...others } = extra;
  const store = sessionStore(cluster);
  return {
    ...others,
    shardIds: [...cluster.shardIds],
    shardCount: cluster.totalShards,
    retrieveSessionInfo: store.retrieveSessionInfo,
    updateSessionInfo: store.updateSessionInfo,
    buildIdentifyThrottler: () => identifyThrottler(cluster),
    rest: gatewayRest(cluster, rest),
  };
}

/**
 * Holds gateway dispatches until ACTIVATE, then hands them to `handler` in
 * order, and from then on each one as it comes, until QUIESCE.
 *
 * Passed at once even before ACTIVATE: READY, RESUMED, and the GUILD_CREATE of
 * each guild READY listed: the session's own state, which no other process
 * received and a process needs to answer requests (they can arrive before
 * ACTIVATE). Everything else waits.
 *
 * At ACTIVATE with a handoff (a deploy's new process) the buffered dispatches
 * up to the old process's last handled one are dropped (see replayMask);
 * without one (first start, respawn) all are handled.
 */
export class DispatchGate {
  /**
   * @param handler (payload, shardId) => void | Promise; errors go to onError
   * @param options.maxBuffered dispatches held before ACTIVATE, all shards
   *   together; past it the oldest are dropped (counted in stats().overflow)
   * @param options.onError called with a handler's error (default console.error)
   */
  constructor(handler, { maxBuffered = 100_000, onError } = {}) {
    this.handler = handler;
    this.maxBuffered = maxBuffered;
    this.onError = onError ?? ((err) => console.error('sm: dispatch handler failed:', err));
    this.state = 'buffering';
    this.buffer = []; // {shardId, payload}, arrival order
    this.recent = new Map(); // shardId -> last HANDOFF_DEPTH handled payloads
    this.pendingGuilds = new Map(); // shardId -> guild ids READY listed, not yet created
    this.counts = { handled: 0, replayed: 0, skipped: 0, overflow: 0, afterQuiesce: 0, passed: 0 };
  }

  /** Feeds one dispatch payload ({op, t, s, d}) of a shard. */
  push(shardId, payload) {
    if (this.isSessionEvent(shardId, payload)) {
      this.counts.passed++;
      this.call(payload, shardId);
      return;
    }
    switch (this.state) {
      case 'active':
        this.handle(shardId, payload);
        return;
      case 'buffering':
        this.buffer.push({ shardId, payload });
        if (this.buffer.length > this.maxBuffered) {
          this.buffer.shift();
          this.counts.overflow++;
        }
        return;
      default:
        this.counts.afterQuiesce++; // the next generation handles these
    }
  }

  isSessionEvent(shardId, payload) {
    if (payload.t === 'READY') {
      const ids = Array.isArray(payload.d?.guilds) ? payload.d.guilds.map((g) => g.id) : [];
      this.pendingGuilds.set(shardId, new Set(ids));
      return true;
    }
    if (payload.t === 'RESUMED') return true;
    if (payload.t === 'GUILD_CREATE') {
      const pending = this.pendingGuilds.get(shardId);
      if (pending?.delete(payload.d?.id)) return true;
    }
    return false;
  }

  handle(shardId, payload) {
    let recent = this.recent.get(shardId);
    if (!recent) this.recent.set(shardId, (recent = []));
    recent.push(payload);
    if (recent.length > HANDOFF_DEPTH) recent.shift();
    this.counts.handled++;
    this.call(payload, shardId);
  }

  call(payload, shardId) {
    try {
      const r = this.handler(payload, shardId);
      if (r && typeof r.then === 'function') r.then(undefined, this.onError);
    } catch (err) {
      this.onError(err);
    }
  }

  /** ACTIVATE: handles the buffer (after the handoff's match point) and goes live. */
  activate(handoff) {
    if (this.state !== 'buffering') return;
    const byShard = new Map();
    for (const e of this.buffer) {
      if (!byShard.has(e.shardId)) byShard.set(e.shardId, []);
      byShard.get(e.shardId).push(e);
    }
    const keep = new Set();
    for (const [shardId, entries] of byShard) {
      const last = handoffFor(handoff, shardId);
      const mask = last ? replayMask(entries.map((e) => dispatchHash(e.payload)), last) : entries.map(() => true);
      entries.forEach((e, i) => (mask[i] ? keep.add(e) : this.counts.skipped++));
    }
    const buffered = this.buffer;
    this.buffer = [];
    this.state = 'active';
    for (const e of buffered) {
      if (!keep.has(e)) continue;
      this.counts.replayed++;
      this.handle(e.shardId, e.payload);
    }
  }

  /** QUIESCE: stops handling and returns the handoff for QUIESCED. */
  stop() {
    this.state = 'stopped';
    this.counts.afterQuiesce += this.buffer.length;
    this.buffer = [];
    return buildHandoff(this.recent);
  }

  /** Counters: handled, replayed/skipped at ACTIVATE, passed, overflow, afterQuiesce, buffered. */
  stats() {
    return { ...this.counts, buffered: this.buffer.length, state: this.state };
  }
}

// Sets the cluster's ready flag once every shard of it has had READY or RESUMED.
function readyTracker(cluster) {
  const up = new Set();
  return (shardId) => {
    up.add(shardId);
    if (cluster.shardIds.every((id) => up.has(id))) cluster.setReady(true);
  };
}

// Wires a gate to the cluster's ACTIVATE and QUIESCE; destroy closes the shards.
function wireLifecycle(cluster, gate, destroy) {
  const store = sessionStore(cluster);
  cluster.onActivate((handoff) => gate.activate(handoff));
  cluster.onQuiesce(async () => {
    store.freeze();
    cluster.setHandoff(gate.stop());
    await destroy({ code: RESUMABLE_CLOSE_CODE, reason: 'sm: quiescing' });
  });
}

/**
 * Runs an @discordjs/ws 2.x WebSocketManager (built with
 * webSocketManagerOptions) under sm: its dispatches go to `handler(payload,
 * shardId)` through a DispatchGate (held until ACTIVATE, deploy handoff
 * applied); the cluster reports ready once every shard has had READY or
 * RESUMED; on QUIESCE it stops handling, puts the handoff in QUIESCED and
 * closes the shards with RESUMABLE_CLOSE_CODE. Returns the gate (its stats()).
 * Call before manager.connect().
 */
export function attach(cluster, manager, handler, options = {}) {
  const gate = new DispatchGate(handler, options);
  const markUp = readyTracker(cluster);
  manager.on('dispatch', (payload, shardId) => gate.push(shardId, payload));
  manager.on('ready', (_data, shardId) => markUp(shardId));
  manager.on('resumed', (shardId) => markUp(shardId));
  wireLifecycle(cluster, gate, (opts) => manager.destroy(opts));
  return gate;
}

/**
 * ClientOptions for discord.js 14's Client: `shards`, `shardCount` and `ws`
 * with buildIdentifyThrottler and a buildStrategy that, around yours
 * (`(manager) => new SimpleShardingStrategy(manager)`, SimpleShardingStrategy
 * imported from 'discord.js' so that it is discord.js's own @discordjs/ws),
 * swaps in the manager's resume store and gateway information and gates the
 * client's dispatches until ACTIVATE (with the deploy handoff), sets the
 * ready flag, and on QUIESCE closes the shards with RESUMABLE_CLOSE_CODE.
 *
 * A process that RESUMEs a shard gets no READY, which discord.js 14 needs to
 * become ready (client.user, the clientReady event): for such a shard it asks
 * GET /users/@me and /applications/@me through the client's REST and gives
 * discord.js a READY with no guilds (the guild cache starts empty after a
 * RESUME: Discord sends no GUILD_CREATE for it).
 *
 * `options.ws` is merged into `ws`; `options.gate` is given to DispatchGate.
 * The returned object's `gate` property is the DispatchGate (its stats()).
 */
export function clientOptions(cluster, { buildStrategy, ws = {}, gate: gateOptions } = {}) {
  if (typeof buildStrategy !== 'function') {
    throw new TypeError("sm: clientOptions needs buildStrategy, e.g. (manager) => new SimpleShardingStrategy(manager) with SimpleShardingStrategy imported from 'discord.js'");
  }
  const store = sessionStore(cluster);
  let reemit = null; // (event, data, shardId) on the manager, once buildStrategy ran
  const gate = new DispatchGate((data, shardId) => reemit?.('dispatch', data, shardId), gateOptions);
  const markUp = readyTracker(cluster);
  const sawReady = new Set();
  let wsManager = null; // discord.js's @discordjs/ws manager, once it is built
  // Wired now, not at login, so that onQuiesce functions the bot adds later
  // run after the shards are closed resumably.
  wireLifecycle(cluster, gate, async (o) => wsManager?.destroy(o));

  const wrapStrategy = (manager) => {
    const opts = manager.options;
    const djsRetrieve = opts.retrieveSessionInfo;
    const djsUpdate = opts.updateSessionInfo;
    const mirrored = new Set();
    // discord.js keeps its own copy (WebSocketShard#sessionInfo; its RESUMED
    // handler reads it), so every session also goes there.
    // Both throw while discord.js has not made its shard objects yet.
    const mirror = (shardId, info) => {
      try {
        djsUpdate(shardId, info);
      } catch {
        // not yet: the next update mirrors it
      }
    };
    const mirroredAlready = (shardId) => {
      try {
        return djsRetrieve(shardId) != null;
      } catch {
        return false;
      }
    };
    opts.retrieveSessionInfo = (shardId) => {
      const info = store.retrieveSessionInfo(shardId);
      if (info && !mirrored.has(shardId)) {
        mirrored.add(shardId);
        if (!mirroredAlready(shardId)) mirror(shardId, info);
      }
      return info;
    };
    opts.updateSessionInfo = (shardId, info) => {
      mirror(shardId, info);
      store.updateSessionInfo(shardId, info);
    };
    const rest = gatewayRest(cluster, opts.rest);
    opts.rest = rest;

    // @discordjs/ws 1.x (discord.js 14's) emits (event, {data, shardId});
    // 2.x emits (event, data, shardId). Every shard's first event (debug)
    // comes before any dispatch, so the shape is known by then.
    const own = manager.emit.bind(manager);
    let v1 = true;
    reemit = (event, data, shardId) => (v1 ? own(event, { data, shardId }) : own(event, data, shardId));

    let identity = null; // {user, application}, asked once
    const synthesizeReady = async (shardId) => {
      identity ??= Promise.all([rest.get('/users/@me'), rest.get('/applications/@me')]);
      const [user, application] = await identity;
      const session = store.retrieveSessionInfo(shardId);
      const d = {
        v: Number(opts.version) || 10, user, guilds: [], session_id: session?.sessionId,
        resume_gateway_url: session?.resumeURL, shard: [shardId, cluster.totalShards],
        application: { id: application.id, flags: application.flags ?? 0 },
      };
      reemit('ready', d, shardId);
      gate.push(shardId, { op: 0, t: 'READY', s: session?.sequence ?? 0, d });
    };

    manager.emit = (event, ...args) => {
      const first = args[0];
      v1 = args.length === 1 && first !== null && typeof first === 'object' && typeof first.shardId === 'number';
      const shardId = v1 ? first.shardId : args[args.length - 1];
      switch (event) {
        case 'dispatch':
          gate.push(shardId, v1 ? first.data : first);
          return true;
        case 'ready':
          sawReady.add(shardId);
          markUp(shardId);
          break;
        case 'resumed':
          markUp(shardId);
          if (!sawReady.has(shardId)) {
            sawReady.add(shardId);
            synthesizeReady(shardId).catch((err) => {
              console.error(`sm: shard ${shardId} resumed, but no READY could be made for discord.js:`, err);
            });
          }
          break;
        default:
      }
      return own(event, ...args);
    };

    wsManager = manager;
    return buildStrategy(manager);
  };

  const options = {
    shards: [...cluster.shardIds],
    shardCount: cluster.totalShards,
    ws: {
      ...ws,
      buildIdentifyThrottler: () => identifyThrottler(cluster),
      buildStrategy: wrapStrategy,
    },
  };
  // Not enumerable, so `...clientOptions(…)` leaves it out of the Client's options.
  Object.defineProperty(options, 'gate', { value: gate, enumerable: false });
  return options;
}
