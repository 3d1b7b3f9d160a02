// A fake Discord gateway for tests: the REST endpoint GET /api/v10/gateway/bot
// and the gateway WebSocket (HELLO, heartbeats, IDENTIFY → READY, RESUME →
// RESUMED with the missed dispatches replayed, op 9 for identifies too close
// together in one bucket), with dispatches generated on a schedule per shard
// and every frame recorded so tests can assert on what a real bot did.
//
// It follows Discord's protocol as @discordjs/ws 2.0.4 and 1.x (discord.js 14)
// speak it (encoding json, no compression):
//   - HELLO   {op:10, d:{heartbeat_interval}}
//   - op 1    heartbeat, answered with op 11; op 1 from the server is never sent
//   - op 2    IDENTIFY {token, intents, properties, shard:[id, count]} → READY
//             (s:1) {v, user, guilds, session_id, resume_gateway_url, shard,
//             application}, then GUILD_CREATE for each of the shard's guilds
//   - op 6    RESUME {token, session_id, seq} → every dispatch after seq, in
//             order with its original s, then RESUMED
//   - op 9    INVALID_SESSION d:false: a RESUME of an unknown, invalidated or
//             expired session; an IDENTIFY under 5 s after its bucket's previous
//             one (a "violation"); an IDENTIFY with no session starts left
//   - closes: a client close with 1000 or 1001 ends the session (a RESUME of
//             it gets op 9), any other code or a dropped connection keeps it
//             resumable for resumeWindowMs, as on Discord
//
// Discord sends a guild's events to every session of its shard, so here every
// generated dispatch goes to every live (connected or resumable) session of
// its shard, each session numbering it with its own rising seq. Each carries a
// unique event id in d.id (and d.shard, d.n) so a test can count deliveries
// and handlings per event.
//
// Not modelled: zlib/zstd compression (a connection asking for it is recorded
// and refused with close 4002), etf, heartbeat timeouts (4009), op 7 on the
// server's own initiative (see reconnect()), the 120-per-minute send limit.

import { createServer } from 'node:http';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { WebSocketServer } from 'ws';

/** Opcodes of Discord's gateway (discord-api-types' GatewayOpcodes). */
export const Op = Object.freeze({
  Dispatch: 0, Heartbeat: 1, Identify: 2, PresenceUpdate: 3, VoiceStateUpdate: 4,
  Resume: 6, Reconnect: 7, RequestGuildMembers: 8, InvalidSession: 9, Hello: 10, HeartbeatAck: 11,
});

/** The user agent sm-manager sends (discord/gateway.go UserAgent). */
export const MANAGER_USER_AGENT_PREFIX = 'DiscordBot (https://github.com/sm-supervisor/sm';

/** Discord's per-bucket identify spacing. */
export const IDENTIFY_SPACING_MS = 5000;

const defaults = {
  token: 'fake-token',
  shards: 8, // the recommended shard count /gateway/bot answers
  total: 1000,
  remaining: 1000,
  resetAfter: 14_400_000,
  maxConcurrency: 1,
  heartbeatIntervalMs: 41_250,
  resumeWindowMs: 120_000,
  dispatchIntervalMs: 100, // per shard; 0 = no scheduled dispatches
  eventType: 'MESSAGE_CREATE',
  guildsPerShard: 0,
  maxLog: 50_000, // dispatches kept per session for replay
  botId: '1100000000000000001',
};

/**
 * Starts a fake gateway on 127.0.0.1 (a free port). Options: see `defaults`.
 * Resolves to the gateway handle; `await gw.close()` stops it and every
 * connection.
 */
export async function startFakeGateway(options = {}) {
  const gw = new FakeGateway({ ...defaults, ...options });
  await gw.listen();
  return gw;
}

class FakeGateway {
  constructor(opts) {
    this.opts = opts;
    this.remaining = opts.remaining;
    this.t0 = performance.now();

    // What happened, in order; tests read these.
    this.gatewayBotCalls = []; // {at, userAgent, authorized}
    this.restCalls = []; // every other REST request: {at, method, path}
    this.connections = []; // {id, at, path, query, resume}
    this.identifies = []; // {at, conn, shard, count, bucket, accepted, reason, sessionId}
    this.resumes = []; // {at, conn, shard, sessionId, seq, accepted, reason, replayed}
    this.closes = []; // {at, conn, shard, sessionId, code, by}
    this.violations = []; // {at, shard, bucket, sinceMs}
    this.sessionStarts = 0;
    this.generated = []; // {id, shard, n, at}
    this.delivered = new Map(); // event id -> number of sends, all sessions and replays

    this.sessions = new Map(); // session id -> Session
    this.lastIdentifyAt = new Map(); // bucket -> ms of the last accepted IDENTIFY
    this.conns = new Set();
    this.nextConn = 1;
    this.nextEvent = new Map(); // shard -> n of its next event
    this.eventSeq = 0;
    this.paused = false;
    this.timer = null;
  }

  /** Milliseconds since the gateway started (the clock of every record). */
  now() {
    return performance.now() - this.t0;
  }

  async listen() {
    this.http = createServer((req, res) => this.onHttp(req, res));
    this.wss = new WebSocketServer({ server: this.http, perMessageDeflate: false });
    this.wss.on('connection', (ws, req) => this.onConnection(ws, req));
    await new Promise((resolve, reject) => {
      this.http.once('error', reject);
      this.http.listen(0, '127.0.0.1', resolve);
    });
    const { port } = this.http.address();
    this.port = port;
    /** The REST root to give as discord.api_base_url. */
    this.apiBaseUrl = `http://127.0.0.1:${port}/api/v10`;
    /** The gateway URL /gateway/bot answers. */
    this.url = `ws://127.0.0.1:${port}`;
    /** What READY says as resume_gateway_url: the same server, another path. */
    this.resumeUrl = `ws://127.0.0.1:${port}/resume`;
    if (this.opts.dispatchIntervalMs > 0) {
      this.timer = setInterval(() => this.tick(), this.opts.dispatchIntervalMs);
    }
  }

  // --- REST ---

  onHttp(req, res) {
    const url = new URL(req.url, 'http://x');
    const send = (status, body) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    const authorized = req.headers.authorization === `Bot ${this.opts.token}`;
    if (req.method === 'GET' && url.pathname === '/api/v10/gateway/bot') {
      this.gatewayBotCalls.push({ at: this.now(), userAgent: req.headers['user-agent'] ?? '', authorized });
      if (!authorized) return send(401, { message: '401: Unauthorized', code: 0 });
      return send(200, this.gatewayBot());
    }
    this.restCalls.push({ at: this.now(), method: req.method, path: url.pathname });
    if (!authorized) return send(401, { message: '401: Unauthorized', code: 0 });
    if (req.method === 'GET' && url.pathname === '/api/v10/users/@me') return send(200, this.user());
    if (req.method === 'GET' && url.pathname === '/api/v10/applications/@me') return send(200, this.application());
    return send(404, { message: '404: Not Found', code: 0 });
  }

  /** The body of GET /gateway/bot, in Discord's shape. */
  gatewayBot() {
    return {
      url: this.url,
      shards: this.opts.shards,
      session_start_limit: {
        total: this.opts.total,
        remaining: this.remaining,
        reset_after: this.opts.resetAfter,
        max_concurrency: this.opts.maxConcurrency,
      },
    };
  }

  /** Sets what the next /gateway/bot answers (remaining, total, maxConcurrency, shards). */
  configure(changes) {
    if ('remaining' in changes) this.remaining = changes.remaining;
    for (const k of ['total', 'maxConcurrency', 'shards', 'resetAfter']) {
      if (k in changes) this.opts[k] = changes[k];
    }
  }

  user() {
    return {
      id: this.opts.botId, username: 'fakebot', discriminator: '0000', global_name: null,
      avatar: null, bot: true, verified: true, flags: 0, mfa_enabled: false,
    };
  }

  application() {
    return { id: this.opts.botId, name: 'fakebot', flags: 0, bot_public: true, bot_require_code_grant: false, description: '', icon: null };
  }

  guildIds(shard, count) {
    // Snowflakes whose (id >> 22) % count is shard, as Discord places guilds.
    const ids = [];
    for (let g = 0; g < this.opts.guildsPerShard; g++) {
      const id = ((BigInt(g) * BigInt(count) + BigInt(shard)) << 22n) + 1n;
      ids.push(String(id));
    }
    return ids;
  }

  guild(id) {
    return {
      id, name: `guild ${id}`, icon: null, splash: null, discovery_splash: null, owner_id: '1',
      afk_channel_id: null, afk_timeout: 300, verification_level: 0, default_message_notifications: 0,
      explicit_content_filter: 0, roles: [], emojis: [], features: [], mfa_level: 0, application_id: null,
      system_channel_id: null, system_channel_flags: 0, rules_channel_id: null, vanity_url_code: null,
      description: null, banner: null, premium_tier: 0, preferred_locale: 'en-US',
      public_updates_channel_id: null, nsfw_level: 0, stickers: [], premium_progress_bar_enabled: false,
      joined_at: new Date(0).toISOString(), large: false, unavailable: false, member_count: 1,
      voice_states: [], members: [], channels: [], threads: [], presences: [], stage_instances: [],
      guild_scheduled_events: [], soundboard_sounds: [],
    };
  }

  // --- gateway ---

  onConnection(ws, req) {
    const url = new URL(req.url, 'http://x');
    const conn = {
      id: this.nextConn++, ws, session: null, heartbeats: 0,
      path: url.pathname, query: Object.fromEntries(url.searchParams),
    };
    this.conns.add(conn);
    this.connections.push({ id: conn.id, at: this.now(), path: conn.path, query: conn.query });
    ws.on('message', (data, isBinary) => this.onFrame(conn, data, isBinary));
    ws.on('close', (code) => this.onClose(conn, code));
    ws.on('error', () => {});
    if (conn.query.compress || (conn.query.encoding && conn.query.encoding !== 'json')) {
      ws.close(4002, 'this fake speaks json without compression');
      return;
    }
    this.send(conn, { op: Op.Hello, d: { heartbeat_interval: this.opts.heartbeatIntervalMs }, s: null, t: null });
  }

  send(conn, payload) {
    if (conn.ws.readyState === conn.ws.OPEN) conn.ws.send(JSON.stringify(payload));
  }

  onFrame(conn, data, isBinary) {
    let frame;
    try {
      if (isBinary) throw new Error('binary');
      frame = JSON.parse(data.toString());
    } catch {
      conn.ws.close(4002, 'decode error');
      return;
    }
    switch (frame.op) {
      case Op.Heartbeat:
        conn.heartbeats++;
        this.send(conn, { op: Op.HeartbeatAck, d: null, s: null, t: null });
        return;
      case Op.Identify:
        return this.onIdentify(conn, frame.d ?? {});
      case Op.Resume:
        return this.onResume(conn, frame.d ?? {});
      case Op.PresenceUpdate:
      case Op.VoiceStateUpdate:
      case Op.RequestGuildMembers:
        if (!conn.session) conn.ws.close(4003, 'not authenticated');
        return;
      default:
        conn.ws.close(4001, 'unknown opcode');
    }
  }

  onIdentify(conn, d) {
    const at = this.now();
    if (conn.session) return conn.ws.close(4005, 'already authenticated');
    if (d.token !== this.opts.token) return conn.ws.close(4004, 'authentication failed');
    const [shard, count] = Array.isArray(d.shard) ? d.shard : [0, 1];
    if (!Number.isInteger(shard) || !Number.isInteger(count) || shard < 0 || shard >= count) {
      return conn.ws.close(4010, 'invalid shard');
    }
    const bucket = shard % this.opts.maxConcurrency;
    const rec = { at, conn: conn.id, shard, count, bucket, accepted: false, reason: '', sessionId: null };
    this.identifies.push(rec);
    const last = this.lastIdentifyAt.get(bucket);
    if (last !== undefined && at - last < IDENTIFY_SPACING_MS) {
      rec.reason = 'rate_limited';
      this.violations.push({ at, shard, bucket, sinceMs: at - last });
      this.send(conn, { op: Op.InvalidSession, d: false, s: null, t: null });
      return;
    }
    if (this.remaining <= 0) {
      rec.reason = 'no_session_starts';
      this.send(conn, { op: Op.InvalidSession, d: false, s: null, t: null });
      return;
    }
    this.lastIdentifyAt.set(bucket, at);
    this.remaining--;
    this.sessionStarts++;
    rec.accepted = true;
    const session = {
      id: randomBytes(16).toString('hex'), shard, count, seq: 0, log: [],
      conn, invalidated: false, detachedAt: null, createdAt: at,
    };
    rec.sessionId = session.id;
    this.sessions.set(session.id, session);
    conn.session = session;
    const guilds = this.guildIds(shard, count);
    this.dispatch(session, 'READY', {
      v: 10, user: this.user(), guilds: guilds.map((id) => ({ id, unavailable: true })),
      session_id: session.id, resume_gateway_url: this.resumeUrl, shard: [shard, count],
      application: { id: this.opts.botId, flags: 0 },
    }, { log: false });
    for (const id of guilds) this.dispatch(session, 'GUILD_CREATE', this.guild(id), { log: false });
  }

  onResume(conn, d) {
    const at = this.now();
    if (conn.session) return conn.ws.close(4005, 'already authenticated');
    if (d.token !== this.opts.token) return conn.ws.close(4004, 'authentication failed');
    const session = this.sessions.get(d.session_id);
    const rec = { at, conn: conn.id, shard: session?.shard ?? null, sessionId: d.session_id ?? null, seq: d.seq, accepted: false, reason: '', replayed: 0 };
    this.resumes.push(rec);
    const invalid = (reason) => {
      rec.reason = reason;
      this.send(conn, { op: Op.InvalidSession, d: false, s: null, t: null });
    };
    if (!session) return invalid('unknown_session');
    if (session.invalidated) return invalid('invalidated');
    if (session.conn === null && at - session.detachedAt > this.opts.resumeWindowMs) {
      session.invalidated = true;
      return invalid('expired');
    }
    if (!Number.isInteger(d.seq) || d.seq > session.seq) return conn.ws.close(4007, 'invalid seq');
    const first = session.log.length ? session.log[0].s : session.seq + 1;
    if (d.seq + 1 < first) return invalid('seq_too_old');
    if (session.conn) {
      // The session is taken over: Discord drops the other connection.
      const old = session.conn;
      old.session = null;
      this.closes.push({ at, conn: old.id, shard: session.shard, sessionId: session.id, code: 4000, by: 'server' });
      old.ws.close(4000, 'session resumed elsewhere');
    }
    session.conn = conn;
    session.detachedAt = null;
    conn.session = session;
    rec.accepted = true;
    for (const ev of session.log) {
      if (ev.s <= d.seq) continue;
      this.send(conn, { op: Op.Dispatch, t: ev.t, s: ev.s, d: ev.d });
      if (ev.d && ev.d.id !== undefined) this.delivered.set(ev.d.id, (this.delivered.get(ev.d.id) ?? 0) + 1);
      rec.replayed++;
    }
    this.dispatch(session, 'RESUMED', null, { log: false });
  }

  onClose(conn, code) {
    this.conns.delete(conn);
    const session = conn.session;
    if (!session) return;
    conn.session = null;
    this.closes.push({ at: this.now(), conn: conn.id, shard: session.shard, sessionId: session.id, code, by: 'client' });
    if (session.conn !== conn) return;
    session.conn = null;
    session.detachedAt = this.now();
    // Discord: closing with 1000 or 1001 ends the session; any other code (or
    // a connection that just drops: 1005/1006 here) leaves it resumable.
    if (code === 1000 || code === 1001) session.invalidated = true;
  }

  /** Sends a dispatch on a session (and keeps it for a later RESUME when log). */
  dispatch(session, t, d, { log = true } = {}) {
    session.seq++;
    const ev = { s: session.seq, t, d };
    if (log) {
      session.log.push(ev);
      if (session.log.length > this.opts.maxLog) session.log.shift();
    }
    if (session.conn) {
      this.send(session.conn, { op: Op.Dispatch, t, s: ev.s, d });
      if (d && d.id !== undefined && log) this.delivered.set(d.id, (this.delivered.get(d.id) ?? 0) + 1);
    }
  }

  /** The live (connected or resumable) sessions of a shard. */
  liveSessions(shard) {
    const now = this.now();
    const out = [];
    for (const s of this.sessions.values()) {
      if (s.shard !== shard || s.invalidated) continue;
      if (s.conn === null && now - s.detachedAt > this.opts.resumeWindowMs) {
        s.invalidated = true;
        continue;
      }
      out.push(s);
    }
    return out;
  }

  /** Shards that have at least one live session. */
  liveShards() {
    const shards = new Set();
    for (const s of this.sessions.values()) if (!s.invalidated) shards.add(s.shard);
    return [...shards].sort((a, b) => a - b);
  }

  tick() {
    if (this.paused) return;
    for (const shard of this.liveShards()) this.emitEvent(shard);
  }

  /**
   * Generates one event for a shard and sends it to every live session of the
   * shard, as Discord sends a guild's events to each of its shard's sessions.
   * Returns the event id.
   */
  emitEvent(shard, extra = {}) {
    const n = this.nextEvent.get(shard) ?? 1;
    this.nextEvent.set(shard, n + 1);
    const id = String(2_000_000_000_000 + ++this.eventSeq);
    const at = this.now();
    this.generated.push({ id, shard, n, at });
    const d = {
      id, shard, n, type: 0, content: `event ${shard}:${n}`, channel_id: '3000', channel_type: 1, // a DM
      author: { id: '4000', username: 'someone', discriminator: '0000', global_name: null, avatar: null },
      timestamp: new Date().toISOString(), edited_timestamp: null, tts: false, mention_everyone: false,
      mentions: [], mention_roles: [], attachments: [], embeds: [], pinned: false, ...extra,
    };
    for (const session of this.liveSessions(shard)) this.dispatch(session, this.opts.eventType, d);
    return id;
  }

  /** Stops (or restarts) the scheduled dispatches. */
  pause(paused = true) {
    this.paused = paused;
  }

  /** Sends op 7 RECONNECT to every connection of a shard. */
  reconnect(shard) {
    for (const c of this.conns) if (c.session?.shard === shard) this.send(c, { op: Op.Reconnect, d: null, s: null, t: null });
  }

  /** Counts for assertions and reports. */
  stats() {
    const fromClusters = this.gatewayBotCalls.filter((c) => !c.userAgent.startsWith(MANAGER_USER_AGENT_PREFIX)).length;
    return {
      gatewayBotCalls: this.gatewayBotCalls.length,
      gatewayBotCallsFromOthers: fromClusters,
      connections: this.connections.length,
      identifies: this.identifies.length,
      identifiesAccepted: this.identifies.filter((i) => i.accepted).length,
      violations: this.violations.length,
      sessionStarts: this.sessionStarts,
      resumes: this.resumes.length,
      resumesAccepted: this.resumes.filter((r) => r.accepted).length,
      replayed: this.resumes.reduce((n, r) => n + r.replayed, 0),
      generated: this.generated.length,
      remaining: this.remaining,
    };
  }

  /** Resolves once pred() is true (polled), rejecting after timeoutMs. */
  async waitFor(pred, timeoutMs = 30_000, what = 'condition') {
    const deadline = Date.now() + timeoutMs;
    while (!pred()) {
      if (Date.now() > deadline) throw new Error(`fake gateway: timed out after ${timeoutMs} ms waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  async close() {
    clearInterval(this.timer);
    for (const c of this.conns) c.ws.terminate();
    await new Promise((resolve) => this.wss.close(() => resolve()));
    this.http.closeAllConnections?.();
    await new Promise((resolve) => this.http.close(() => resolve()));
  }
}
