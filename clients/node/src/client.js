// A role client (docs/protocol.md, "Client"): a script, a dashboard or a
// service that sends business ops, STATUS, WATCH and DEPLOY, with no identity
// but its uid. It reconnects after a manager restart like a cluster does.

import process from 'node:process';
import { SmError, Codes } from './errors.js';
import { Link } from './link.js';
import { Peer, linkOptions } from './peer.js';

function topologyOf(r) {
  return {
    clusters: r?.clusters,
    totalShards: r?.total_shards,
    shardsPerCluster: r?.shards_per_cluster,
    protocol: r?.protocol,
    conn: r?.conn,
  };
}

/**
 * A registered client connection. Made by connectClient(); an EventEmitter
 * with 'reconnect' (REGISTER reply payload), 'disconnect' (error) and
 * 'warning' (SmError: the manager's notice about a frame of ours).
 */
export class Client extends Peer {
  constructor(o) {
    super(o);
    this.socketPath = o.socket ?? process.env.SM_SOCKET;
    if (!this.socketPath) throw new SmError(Codes.BAD_CONFIG, 'connectClient needs {socket} (or SM_SOCKET)');
    this.name = o.name ?? '';
    this._options = o;
    this._watches = new Set();
    Object.assign(this, topologyOf(null));
    this.link = new Link({
      ...linkOptions(o, 5000),
      path: this.socketPath,
      register: () => ({ role: 'client', name: this.name }),
      onFrame: (f) => {
        if (f.op === 'REPLY') this.strayReply(f);
      },
      logger: this.logger,
    });
    this.link.on('registered', (payload, first) => {
      Object.assign(this, topologyOf(payload));
      if (!first) this.emit('reconnect', payload);
    });
    this.link.on('disconnect', (err) => this.emit('disconnect', err));
  }

  async open() {
    await this.link.start();
    return this;
  }

  /** The manager's status snapshot (STATUS). */
  async status(opts) {
    const reply = await this.call({ op: 'STATUS' }, opts);
    return reply.payload;
  }

  /**
   * Starts a deploy (DEPLOY): plan {clusters, maxParallel}; resolves with
   * the reply ({deploy_id, generation, from, to, reclustering}).
   */
  async deploy(plan = {}, opts) {
    const f = { op: 'DEPLOY' };
    if (plan.clusters !== undefined) f.clusters = plan.clusters;
    if (plan.maxParallel !== undefined) f.max_parallel = plan.maxParallel;
    const reply = await this.call(f, opts);
    return reply.payload;
  }

  /**
   * Subscribes to the state feed (WATCH) on a connection of its own, so that
   * close() ends it (the protocol has no UNWATCH). onEvent(event) gets every
   * EVENT's payload, the snapshot first. After a `dropped` event, and after
   * a reconnection, it WATCHes again: a new snapshot follows.
   */
  async watch(onEvent, opts = {}) {
    if (typeof onEvent !== 'function') throw new TypeError('sm: watch needs a function');
    const w = new Watch(this, onEvent, opts);
    this._watches.add(w);
    try {
      await w.open();
    } catch (err) {
      this._watches.delete(w);
      await w.close();
      throw err;
    }
    return w;
  }

  /** Closes the connection and every watch. */
  async close() {
    await Promise.all([...this._watches].map((w) => w.close()));
    await this.link.close();
  }
}

/** A WATCH subscription on its own connection; close() ends it. */
class Watch {
  constructor(client, onEvent, opts) {
    this.client = client;
    this.onEvent = onEvent;
    this.log = client.logger;
    this.closed = false;
    this.link = new Link({
      ...linkOptions({ ...client._options, ...opts }, 5000),
      path: client.socketPath,
      register: () => ({ role: 'client', name: client.name ? `${client.name} (watch)` : 'watch' }),
      onFrame: (f) => this.onFrame(f),
      logger: client.logger,
    });
    this.link.on('registered', (_payload, first) => {
      if (!first) this.subscribe().catch(() => {});
    });
  }

  async open() {
    await this.link.start();
    await this.subscribe();
  }

  async subscribe() {
    const reply = await this.link.request({ op: 'WATCH' }, { timeoutMs: 10_000 }).catch((err) => {
      if (!this.closed) this.log.warn(`sm: WATCH failed: ${err.code ?? ''} ${err.message}`);
      throw err;
    });
    if (reply.payload?.watching !== true) throw new SmError(Codes.INTERNAL, 'WATCH answered without watching:true');
  }

  onFrame(f) {
    if (f.op !== 'EVENT' || this.closed) return;
    try {
      this.onEvent(f.payload);
    } catch (err) {
      this.log.error(`sm: a watch function threw: ${err?.stack ?? err}`);
    }
    if (f.payload?.type === 'dropped' && !this.closed) {
      // The manager stopped this subscription; a new one starts with a snapshot.
      this.subscribe().catch(() => {});
    }
  }

  /** Ends the subscription and its connection. */
  async close() {
    this.closed = true;
    this.client._watches.delete(this);
    await this.link.close();
  }
}

/** Connects a role client to the manager's socket and resolves once registered. */
export async function connectClient(options = {}) {
  const c = new Client(options);
  try {
    return await c.open();
  } catch (err) {
    await c.close().catch(() => {});
    throw err;
  }
}
