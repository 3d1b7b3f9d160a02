// Types of @sm-supervisor/client (hand-written; the package is plain ESM).
// Protocol v1 reference: docs/protocol.md in the sm repository.

import { EventEmitter } from 'node:events';

/** Error codes of protocol v1, plus the package's `handler_error`. */
export type ErrorCode =
  | 'bad_frame' | 'frame_too_large' | 'not_registered' | 'forbidden' | 'unknown_target'
  | 'unavailable' | 'timeout' | 'busy' | 'deploy_in_progress' | 'unknown_id' | 'bad_config'
  | 'shutting_down' | 'unknown_op' | 'internal' | 'budget_refused' | 'cancelled' | 'handler_error';

/** The error codes as constants: `Codes.UNAVAILABLE === 'unavailable'`. */
export const Codes: Readonly<{
  BAD_FRAME: 'bad_frame'; FRAME_TOO_LARGE: 'frame_too_large'; NOT_REGISTERED: 'not_registered';
  FORBIDDEN: 'forbidden'; UNKNOWN_TARGET: 'unknown_target'; UNAVAILABLE: 'unavailable';
  TIMEOUT: 'timeout'; BUSY: 'busy'; DEPLOY_IN_PROGRESS: 'deploy_in_progress'; UNKNOWN_ID: 'unknown_id';
  BAD_CONFIG: 'bad_config'; SHUTTING_DOWN: 'shutting_down'; UNKNOWN_OP: 'unknown_op'; INTERNAL: 'internal';
  BUDGET_REFUSED: 'budget_refused'; CANCELLED: 'cancelled'; HANDLER_ERROR: 'handler_error';
}>;

/**
 * Every failure the package reports: a REPLY's error (code and message as the
 * manager or the cluster sent them) or a local one. A cluster's own codes
 * (anything a handler throws with `code`) pass through, hence `string`.
 */
export class SmError extends Error {
  constructor(code: string, message?: string, options?: { cause?: unknown });
  readonly name: 'SmError';
  readonly code: ErrorCode | (string & {});
  toJSON(): { code: string; message: string };
  static from(wire: unknown): SmError;
}

/** The manager's default limits.max_frame_bytes: 1 MiB. */
export const DEFAULT_MAX_FRAME_BYTES: number;
/** The deadline of a request that names none (the manager's default requests.timeout): 10 s. */
export const DEFAULT_REQUEST_TIMEOUT_MS: number;
/** How much later than timeout_ms the local timer fires: 250 ms. */
export const LOCAL_DEADLINE_GRACE_MS: number;

/** A logger: any of the four methods (console works); null in options silences the package. */
export interface Logger {
  debug?(msg: string): void;
  info?(msg: string): void;
  warn?(msg: string): void;
  error?(msg: string): void;
}

/** Reconnection backoff: minMs·2ⁿ capped at maxMs, ±jitter. */
export interface Backoff {
  minMs?: number;
  maxMs?: number;
  jitter?: number;
}

/** Options of both connect() and connectClient(). */
export interface CommonOptions {
  /** The manager's socket; default SM_SOCKET. */
  socket?: string;
  /** Deadline of requests that name none (sent as timeout_ms); default 10000. */
  requestTimeoutMs?: number;
  /** Set to the manager's limits.max_frame_bytes if it is not the default 1 MiB. */
  maxFrameBytes?: number;
  /** Reconnect after a lost connection; default true. */
  reconnect?: boolean;
  /** Default {minMs: 50, maxMs: 5000, jitter: 0.2}, as ipc.Client. */
  backoff?: Backoff;
  /** Longest wait for the REGISTER reply on each attempt; default 10000. */
  registerTimeoutMs?: number;
  /** How long the first registration is retried (no socket yet, busy, ...); cluster 30000, client 5000. */
  connectTimeoutMs?: number;
  /** Default: warnings and errors to stderr; null: nothing. */
  logger?: Logger | null;
}

export interface RequestOptions {
  /** The request's deadline: sent as timeout_ms, and a local timer LOCAL_DEADLINE_GRACE_MS later. */
  timeoutMs?: number;
  /** Aborting rejects the request with the signal's reason (the manager is not told). */
  signal?: AbortSignal;
}

/** A cluster id (number) or a target string: '3', 'shard:5', 'guild:<snowflake>'. */
export type Target = number | string;

/** One cluster's part of a broadcast. */
export type BroadcastResult<T = unknown> =
  | { cluster: number; payload: T; error?: undefined }
  | { cluster: number; error: SmError; payload?: undefined };

/** What a business-op handler receives as its second argument: the frame as forwarded. */
export interface IncomingFrame {
  op: string;
  id?: string;
  target?: string;
  payload?: unknown;
}

/** A shard's resume state, in @discordjs/ws SessionInfo's field names. */
export interface SessionInfo {
  sessionId: string;
  sequence: number;
  resumeURL: string;
  shardId: number;
  shardCount: number;
}

/** The manager's identify gate, from the REGISTER reply's `identify`. */
export interface IdentifyGate {
  gate: boolean;
  maxConcurrency: number;
  spacingMs: number;
}

/** GET /gateway/bot's answer, as the manager hands it out (Discord's shape). */
export interface GatewayInformation {
  url: string;
  shards: number;
  session_start_limit: { total: number; remaining: number; reset_after: number; max_concurrency: number };
}

export interface IdentifyGrant {
  granted: true;
  shard: number;
  /** The rate-limit bucket (shard % max_concurrency); null when the manager has no gate. */
  bucket: number | null;
}

/** Events both kinds of connection emit. */
interface PeerEvents {
  /** The connection came back and registered again (the REGISTER reply's payload). */
  reconnect: [payload: Record<string, unknown>];
  /** The connection was lost (requests in flight failed `unavailable`). */
  disconnect: [error: Error | undefined];
  /** The manager reported a problem with a frame of ours (a REPLY without id). */
  warning: [error: SmError];
}

interface Peer {
  /** Whether the connection is registered right now. */
  readonly connected: boolean;
  /** Sends a business op; resolves with the reply's payload (null if none). */
  request<T = unknown>(target: Target, op: string, payload?: unknown, options?: RequestOptions): Promise<T>;
  /** Sends a business op to every cluster; one result per cluster, in cluster order. */
  broadcast<T = unknown>(op: string, payload?: unknown, options?: RequestOptions): Promise<BroadcastResult<T>[]>;
  /** Fire and forget (no id, no reply). False when not connected: the frame is dropped. */
  send(target: Target, op: string, payload?: unknown): boolean;
}

export interface ClusterOptions extends CommonOptions {
  /** Override SM_CLUSTER. */
  cluster?: number;
  /** Override SM_GENERATION. */
  generation?: number;
  /** Override SM_TOKEN. */
  token?: string;
  /** Where SM_* come from; default process.env. */
  env?: Record<string, string | undefined>;
  /** Override the manager's heartbeat_interval_ms. */
  heartbeatIntervalMs?: number;
  /** Exit 0 once QUIESCED is sent; default true. */
  exitOnQuiesce?: boolean;
  /** Exit 1 when a re-REGISTER is refused (forbidden); default true. */
  exitOnRefused?: boolean;
  /** Treat SIGTERM as QUIESCE; default true. */
  handleSigterm?: boolean;
  /**
   * Override SM_ORPHAN_TIMEOUT_MS (set by a manager in a mesh): how long the
   * process may be without its manager before it is orphaned; 0 is never.
   */
  orphanTimeoutMs?: number;
  /** Exit ORPHAN_EXIT_CODE (75) when orphaned; default true. */
  exitOnOrphan?: boolean;
}

/** The exit status of an orphaned cluster process (EX_TEMPFAIL). */
export declare const ORPHAN_EXIT_CODE: 75;

/** How the manager started this process (REGISTER reply `start`). */
export type StartKind = 'first' | 'respawn' | 'candidate' | 'unknown';

interface ClusterEvents extends PeerEvents {
  activate: [handoff: Record<string, unknown> | undefined];
  quiesce: [source: 'QUIESCE' | 'SIGTERM' | string];
  quiesced: [];
  /** A re-REGISTER was refused: final (with exitOnRefused the process exits 1). */
  error: [error: SmError];
  /**
   * The manager's socket could not be reached for orphanTimeoutMs (with
   * exitOnOrphan the process then exits 75).
   */
  orphaned: [error: SmError];
}

/** A registered cluster process. */
export class Cluster extends EventEmitter<ClusterEvents> implements Peer {
  readonly connected: boolean;
  /** Cluster id (SM_CLUSTER). */
  readonly id: number;
  readonly generation: number;
  readonly shardFirst: number;
  readonly shardLast: number;
  /** shardFirst..shardLast. */
  readonly shardIds: number[];
  readonly totalShards: number;
  readonly start: StartKind;
  /** True once ACTIVATE came (or the reply said the process already had it). */
  readonly active: boolean;
  readonly quiescing: boolean;
  readonly heartbeatIntervalMs: number;
  /** SM_ORPHAN_TIMEOUT_MS (or the option); 0 when the process is never orphaned. */
  readonly orphanTimeoutMs: number;
  /** The manager's identify gate; null from a manager without one. */
  readonly identifyGate: IdentifyGate | null;
  /** /gateway/bot as the manager knows it; null without a Discord token. */
  readonly gateway: GatewayInformation | null;
  /** The sessions the manager handed over to RESUME, by shard. */
  readonly resume: Map<number, SessionInfo>;
  /** What QUIESCED will carry as `handoff`. */
  readonly handoff: Record<string, unknown> | undefined;
  /** The REGISTER reply's payload, as received (the latest registration's). */
  readonly registration: Record<string, unknown> | null;

  request<T = unknown>(target: Target, op: string, payload?: unknown, options?: RequestOptions): Promise<T>;
  broadcast<T = unknown>(op: string, payload?: unknown, options?: RequestOptions): Promise<BroadcastResult<T>[]>;
  send(target: Target, op: string, payload?: unknown): boolean;

  /** Answers op with fn's result (undefined → null); a throw is a REPLY error with err.code or handler_error. */
  handle(op: string, fn: (payload: any, frame: IncomingFrame) => unknown): this;
  /** The heartbeat's ready flag (the manager latches the first true). */
  setReady(ready?: boolean): void;
  /** The heartbeat payload: a JSON value, or a function called at each beat. */
  setStats(stats: unknown | (() => unknown)): void;
  /** A shard's resume state for HEARTBEAT and QUIESCED; null forgets it. */
  setSession(shardId: number, info: Omit<SessionInfo, 'shardId' | 'shardCount'> & { shardCount?: number } | null): void;
  /** What QUIESCED carries for the next generation's ACTIVATE. */
  setHandoff(handoff: Record<string, unknown> | undefined): void;
  /**
   * Waits for the identify gate's slot. Rejects with SmError (budget_refused,
   * timeout, forbidden, cancelled, unavailable) or, on abort, with the
   * signal's reason after withdrawing the ask (IDENTIFY_CANCEL).
   */
  identify(shardId: number, options?: { signal?: AbortSignal; timeoutMs?: number }): Promise<IdentifyGrant>;
  /** fn(handoff) once ACTIVATE comes (at once if it came). */
  onActivate(fn: (handoff: Record<string, unknown> | undefined) => void): this;
  whenActive(): Promise<Record<string, unknown> | undefined>;
  /** fn runs on QUIESCE or SIGTERM, awaited in order, before QUIESCED is sent. */
  onQuiesce(fn: (source: string) => unknown | Promise<unknown>): this;
  /** Quiesce now, as on QUIESCE (the same promise on every call). */
  quiesce(source?: string): Promise<void>;
  /** Stops heartbeats and closes the connection, without QUIESCED or exit. */
  close(): Promise<void>;
}

export interface ClientOptions extends CommonOptions {
  /** Free text for the manager's logs. */
  name?: string;
}

/** A WATCH subscription on its own connection. */
export interface Watch {
  close(): Promise<void>;
}

/** A state-feed event (docs/protocol.md, "STATUS, WATCH, EVENT"). */
export interface FeedEvent {
  type: 'snapshot' | 'heartbeat' | 'cluster' | 'deploy' | 'topology' | 'discord' | 'dropped' | (string & {});
  [field: string]: unknown;
}

export interface DeployReply {
  deploy_id: string;
  generation: number;
  from?: { total_shards: number; shards_per_cluster: number };
  to?: { total_shards: number; shards_per_cluster: number };
  reclustering?: boolean;
}

/** A registered role client. */
export class Client extends EventEmitter<PeerEvents> implements Peer {
  readonly connected: boolean;
  readonly name: string;
  /** From the REGISTER reply. */
  readonly clusters: number;
  readonly totalShards: number;
  readonly shardsPerCluster: number;
  readonly protocol: number;
  readonly conn: number;

  request<T = unknown>(target: Target, op: string, payload?: unknown, options?: RequestOptions): Promise<T>;
  broadcast<T = unknown>(op: string, payload?: unknown, options?: RequestOptions): Promise<BroadcastResult<T>[]>;
  send(target: Target, op: string, payload?: unknown): boolean;

  /** STATUS: the manager's snapshot. */
  status(options?: RequestOptions): Promise<Record<string, any>>;
  /** DEPLOY: roll clusters (all if none) to a new generation. */
  deploy(plan?: { clusters?: number[]; maxParallel?: number }, options?: RequestOptions): Promise<DeployReply>;
  /** WATCH on a connection of its own: the snapshot, then events; again after `dropped` or a reconnection. */
  watch(onEvent: (event: FeedEvent) => void, options?: CommonOptions): Promise<Watch>;
  /** Closes the connection and its watches; requests in flight fail `unavailable`. */
  close(): Promise<void>;
}

/** Connects this cluster process (from SM_*) and resolves after the REGISTER reply. */
export function connect(options?: ClusterOptions): Promise<Cluster>;

/** Connects a role client and resolves after the REGISTER reply. */
export function connectClient(options?: ClientOptions): Promise<Client>;
