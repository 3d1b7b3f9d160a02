// Types of @sm-supervisor/client/discordjs. Structural, so that they need
// neither @discordjs/ws nor discord.js installed to type-check; values of
// those libraries' types fit them.

import type { Cluster, SessionInfo, GatewayInformation } from './index.js';

export type { SessionInfo, GatewayInformation };

/** A gateway dispatch payload as the libraries emit it. */
export interface DispatchPayload {
  op: 0;
  t: string;
  s: number;
  d: any;
}

/** The close code that keeps a session resumable: 4200 (@discordjs/ws CloseCodes.Resuming). */
export declare const RESUMABLE_CLOSE_CODE: 4200;
/** Handled dispatches per shard the deploy handoff carries. */
export declare const HANDOFF_DEPTH: 16;
/** FNV-1a 64 (hex) of `t` + JSON of `d`: the handoff's hash of a dispatch. */
export declare function dispatchHash(payload: { t: string; d: unknown }): string;

/** @discordjs/ws's IIdentifyThrottler. */
export interface IdentifyThrottler {
  waitForIdentify(shardId: number, signal: AbortSignal): Promise<void>;
}

/**
 * For buildIdentifyThrottler: asks the manager's identify gate. Rejects only
 * when the signal aborts; refusals are waited out (`budget_refused`: retryMs,
 * default 30 s).
 */
export declare function identifyThrottler(
  cluster: Cluster,
  options?: { retryMs?: number; logger?: { warn(msg: string): void } },
): IdentifyThrottler;

/** The manager's resume store, as @discordjs/ws's session hooks. */
export interface SessionStore {
  retrieveSessionInfo(shardId: number): SessionInfo | null;
  updateSessionInfo(shardId: number, info: SessionInfo | null): void;
  /** Keep every session from now on (QUIESCE has begun). */
  freeze(): void;
}
export declare function sessionStore(cluster: Cluster): SessionStore;

/** The REGISTER reply's gateway information, in GET /gateway/bot's shape. Throws without one. */
export declare function gatewayInformation(cluster: Cluster): GatewayInformation;

/** A REST-like object answering GET /gateway/bot from the manager and passing the rest to `rest`. */
export declare function gatewayRest<R extends { get(route: string, ...args: any[]): Promise<unknown> }>(
  cluster: Cluster,
  rest?: R,
): R;

/** The options webSocketManagerOptions sets. */
export interface SmWebSocketManagerOptions {
  shardIds: number[];
  shardCount: number;
  retrieveSessionInfo(shardId: number): SessionInfo | null;
  updateSessionInfo(shardId: number, info: SessionInfo | null): void;
  buildIdentifyThrottler(): IdentifyThrottler;
  rest: any;
}

/** Options for @discordjs/ws 2.x's WebSocketManager, with `extra` (token, intents, …) merged under them. */
export declare function webSocketManagerOptions<E extends object = {}>(
  cluster: Cluster,
  extra?: E,
): Omit<E, keyof SmWebSocketManagerOptions> & SmWebSocketManagerOptions;

export interface DispatchGateOptions {
  /** Dispatches held before ACTIVATE (all shards); past it the oldest are dropped. Default 100000. */
  maxBuffered?: number;
  /** A handler's thrown or rejected error. Default: console.error. */
  onError?(err: unknown): void;
}

export interface DispatchGateStats {
  handled: number;
  replayed: number;
  skipped: number;
  passed: number;
  overflow: number;
  afterQuiesce: number;
  buffered: number;
  state: 'buffering' | 'active' | 'stopped';
}

/** Holds dispatches until ACTIVATE, applies the deploy handoff, stops at QUIESCE. */
export declare class DispatchGate {
  constructor(handler: (payload: DispatchPayload, shardId: number) => unknown, options?: DispatchGateOptions);
  push(shardId: number, payload: DispatchPayload): void;
  activate(handoff?: unknown): void;
  /** Stops handling; returns the handoff for QUIESCED. */
  stop(): { v: 1; shards: Record<string, { last: string[] }> };
  stats(): DispatchGateStats;
}

/** An @discordjs/ws 2.x WebSocketManager, as far as attach uses it. */
export interface WebSocketManagerLike {
  on(event: string, listener: (...args: any[]) => unknown): unknown;
  destroy(options?: { code?: number; reason?: string }): unknown;
}

/**
 * Runs a WebSocketManager under sm: dispatches to `handler` through a
 * DispatchGate, the ready flag, QUIESCE (handoff, close with 4200). Call before connect().
 */
export declare function attach(
  cluster: Cluster,
  manager: WebSocketManagerLike,
  handler: (payload: DispatchPayload, shardId: number) => unknown,
  options?: DispatchGateOptions,
): DispatchGate;

/** ClientOptions for discord.js 14's Client (spread them into yours). */
export interface SmClientOptions {
  shards: number[];
  shardCount: number;
  ws: Record<string, unknown> & {
    buildIdentifyThrottler(): IdentifyThrottler;
    buildStrategy(manager: any): any;
  };
  /** Not enumerable: left out by a spread. */
  readonly gate: DispatchGate;
}

export declare function clientOptions(
  cluster: Cluster,
  options: {
    /** e.g. (manager) => new SimpleShardingStrategy(manager), imported from 'discord.js'. */
    buildStrategy(manager: any): any;
    /** Other `ws` options (large_threshold, …). */
    ws?: Record<string, unknown>;
    gate?: DispatchGateOptions;
  },
): SmClientOptions;
