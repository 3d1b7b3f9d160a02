// Test helper shared by the core and the discord.js tests: builds the real
// sm-manager and cluster-harness from this repository (once per `node --test`
// run), writes a config to a temporary directory, starts a manager in its own
// process group, and kills everything it started: the manager, and every
// cluster process it spawned (each leads its own process group), found
// through a pid file the cluster command's wrapper appends to.
//
//   const m = await startManager({ topology: {...}, cluster: { command, env } });
//   const c = await m.client();            // a role client (connectClient)
//   await m.waitReady();                   // every cluster ready and routed
//   await m.kill('SIGKILL'); await m.restart();
//   await m.cleanup();                     // in after(): stop, kill, remove

import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { connectClient } from '../../src/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));

/** The package root (clients/node) and the repository root. */
export const PACKAGE_DIR = path.resolve(here, '..', '..');
export const REPO_DIR = path.resolve(PACKAGE_DIR, '..', '..');

/** Absolute path of a file in test/fixtures. */
export function fixture(name) {
  return path.join(PACKAGE_DIR, 'test', 'fixtures', name);
}

// ---- binaries

// `node --test` runs each test file in a child process of its own: the
// runner's pid names this run, so the files of one run share one build.
const BIN_PREFIX = 'sm-node-test-bin-';
let binDirPromise = null;

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return err.code === 'EPERM';
  }
}

/**
 * Builds sm-manager and cluster-harness (go build, into a temp dir shared by
 * the test files of this run) and returns their paths. $SM_TEST_BIN_DIR, if
 * set, names a directory holding both already built: nothing is built.
 */
export async function binaries() {
  binDirPromise ??= (async () => {
    if (process.env.SM_TEST_BIN_DIR) return path.resolve(process.env.SM_TEST_BIN_DIR);
    const tmp = os.tmpdir();
    // Builds of runs that have ended are removed: nothing else uses them.
    for (const name of fs.readdirSync(tmp)) {
      if (!name.startsWith(BIN_PREFIX)) continue;
      const pid = Number(name.slice(BIN_PREFIX.length));
      if (Number.isInteger(pid) && pid !== process.ppid && !alive(pid)) {
        fs.rmSync(path.join(tmp, name), { recursive: true, force: true });
      }
    }
    const dir = path.join(tmp, BIN_PREFIX + process.ppid);
    const ok = ['sm-manager', 'cluster-harness'].every((b) => fs.existsSync(path.join(dir, b)));
    if (!ok) {
      const staging = fs.mkdtempSync(path.join(tmp, 'sm-node-test-build-'));
      execFileSync('go', ['build', '-o', staging, './cmd/sm-manager', './cmd/cluster-harness'], {
        cwd: REPO_DIR,
        stdio: ['ignore', 'inherit', 'inherit'],
      });
      try {
        fs.renameSync(staging, dir);
      } catch {
        fs.rmSync(staging, { recursive: true, force: true }); // another file of this run won
      }
    }
    return dir;
  })();
  const dir = await binDirPromise;
  return { dir, smManager: path.join(dir, 'sm-manager'), clusterHarness: path.join(dir, 'cluster-harness') };
}

/** cluster.command for the simulated bot (cluster-harness --simulate) with flags. */
export async function harnessCommand(...flags) {
  const { clusterHarness } = await binaries();
  return [clusterHarness, '--simulate', '--connect-delay=5ms', '--event-interval=0', ...flags];
}

/** cluster.command for a Node script using the package. */
export function nodeCommand(script, ...args) {
  return [process.execPath, script, ...args];
}

// ---- config

function tomlValue(v) {
  if (typeof v === 'string') return JSON.stringify(v);
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) throw new Error(`toml: ${v} is not a number`);
    return String(v);
  }
  if (typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `[${v.map(tomlValue).join(', ')}]`;
  throw new Error(`toml: cannot write ${typeof v}`);
}

const isTable = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

/** A TOML document from a plain object of scalars, arrays and tables. */
export function toToml(obj, prefix = '') {
  const lines = [];
  const tables = [];
  for (const [k, v] of Object.entries(obj)) {
    if (v === undefined) continue;
    if (isTable(v)) tables.push([k, v]);
    else lines.push(`${JSON.stringify(k)} = ${tomlValue(v)}`);
  }
  for (const [k, v] of tables) {
    const name = prefix ? `${prefix}.${JSON.stringify(k)}` : JSON.stringify(k);
    lines.push('', `[${name}]`, toToml(v, name));
  }
  return lines.join('\n');
}

function merge(base, over) {
  const out = { ...base };
  for (const [k, v] of Object.entries(over ?? {})) {
    out[k] = isTable(v) && isTable(base[k]) ? merge(base[k], v) : v;
  }
  return out;
}

// Every process group this test file started, killed at exit whatever happens,
// and every directory it made, removed then unless cleanup() was told to keep it.
const groups = new Set();
const dirs = new Set();
process.on('exit', () => {
  for (const pid of groups) {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
  for (const dir of dirs) fs.rmSync(dir, { recursive: true, force: true });
});

/**
 * Starts an sm-manager. opts is merged over a small, fast default config
 * (2 clusters of 2 shards running the test fixture cluster, short heartbeats
 * and backoffs, no TCP listeners); opts.stateDir: true gives it a state
 * directory (re-adoption after a restart); opts.env is the manager's extra
 * environment. Resolves once a client can register.
 */
export async function startManager(opts = {}) {
  const { stateDir = false, env = {}, ...over } = opts;
  const { smManager } = await binaries();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sm-node-test-'));
  dirs.add(dir);
  const pidFile = path.join(dir, 'cluster-pids');
  const logFile = path.join(dir, 'cluster-events.jsonl');
  const base = {
    socket: path.join(dir, 'sm.sock'),
    log_level: 'debug',
    topology: { total_shards: 4, shards_per_cluster: 2 },
    cluster: { command: nodeCommand(fixture('cluster.js')), env: {} },
    heartbeat: { interval: '100ms', timeout: '3s', start_timeout: '15s' },
    restart: { backoff_min: '50ms', backoff_max: '500ms', stop_grace: '2s' },
    requests: { timeout: '5s' },
    shutdown: { timeout: '5s' },
    deploy: { ready_timeout: '15s', quiesce_timeout: '5s' },
    status: { listen: '' },
    admin: { listen: '' },
    state: { dir: stateDir ? path.join(dir, 'state') : '', adopt_window: '5s' },
    discord: { identify_spacing: '1ms' },
  };
  const config = merge(base, over);
  // The wrapper records each cluster process's pid (sh execs the command, so
  // the pid is the cluster's, which the manager checks at REGISTER).
  config.cluster = {
    ...config.cluster,
    command: ['/bin/sh', '-c', 'echo $$ >> "$SMTEST_PIDS"; exec "$@"', 'sh', ...config.cluster.command],
    env: { SMTEST_LOG: logFile, ...config.cluster.env, SMTEST_PIDS: pidFile },
  };
  const m = new Manager({ dir, config, pidFile, logFile, smManager, env });
  m.writeConfig();
  await m.start();
  return m;
}

class Manager {
  constructor({ dir, config, pidFile, logFile, smManager, env }) {
    this.dir = dir;
    this.config = config;
    this.socket = config.socket;
    this.configPath = path.join(dir, 'sm.toml');
    this.managerLog = path.join(dir, 'manager.log');
    this.pidFile = pidFile;
    this.eventsFile = logFile;
    this.bin = smManager;
    this.env = env;
    this.proc = null;
    this.clients = new Set();
    this.exited = null;
  }

  /** Rewrites the config file (a DEPLOY re-reads it); patch is merged in. */
  writeConfig(patch) {
    if (patch) {
      const command = this.config.cluster.command;
      this.config = merge(this.config, patch);
      if (patch.cluster?.command) {
        this.config.cluster.command = ['/bin/sh', '-c', 'echo $$ >> "$SMTEST_PIDS"; exec "$@"', 'sh', ...patch.cluster.command];
      } else {
        this.config.cluster.command = command;
      }
    }
    fs.writeFileSync(this.configPath, toToml(this.config) + '\n');
  }

  /** Starts the manager process and waits until a client can register. */
  async start() {
    const out = fs.openSync(this.managerLog, 'a');
    this.proc = spawn(this.bin, ['-config', this.configPath], {
      detached: true,
      stdio: ['ignore', out, out],
      env: { ...process.env, ...this.env },
    });
    fs.closeSync(out);
    groups.add(this.proc.pid);
    const proc = this.proc;
    this.exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
    this.exited.then(() => groups.delete(proc.pid));
    const deadline = Date.now() + 15_000;
    for (;;) {
      if (proc.exitCode !== null || proc.signalCode !== null) {
        throw new Error(`sm-manager exited at start:\n${this.log().slice(-3000)}`);
      }
      try {
        const c = await connectClient({ socket: this.socket, name: 'test-probe', connectTimeoutMs: 0, reconnect: false, logger: null });
        await c.close();
        return;
      } catch (err) {
        if (Date.now() > deadline) throw new Error(`sm-manager did not accept a client within 15 s: ${err.message}\n${this.log().slice(-3000)}`);
        await sleep(20);
      }
    }
  }

  /** The pid of the running manager. */
  get pid() {
    return this.proc?.pid;
  }

  /** Sends sig to the manager and waits (at most 15 s) for it to exit. */
  async kill(sig = 'SIGKILL') {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode !== null) return this.exited;
    this.proc.kill(sig);
    let timer;
    const res = await Promise.race([this.exited, new Promise((resolve) => { timer = setTimeout(resolve, 15_000, null); })]);
    clearTimeout(timer);
    if (res === null) {
      this.proc.kill('SIGKILL');
      return this.exited;
    }
    return res;
  }

  /** Starts the manager again with the same config (after kill). */
  async restart() {
    await this.kill('SIGKILL');
    await this.start();
  }

  /** A role client on this manager, closed by cleanup(). */
  async client(opts = {}) {
    const c = await connectClient({ socket: this.socket, name: 'test', logger: null, ...opts });
    this.clients.add(c);
    return c;
  }

  /** STATUS through a short-lived client. */
  async status() {
    const c = await connectClient({ socket: this.socket, name: 'test-status', logger: null, reconnect: false });
    try {
      return await c.status();
    } finally {
      await c.close();
    }
  }

  /**
   * Polls STATUS until pred(status) is truthy (every 25 ms, at most
   * timeoutMs) and returns that status.
   */
  async waitStatus(pred, { timeoutMs = 15_000, what = 'status condition' } = {}) {
    const deadline = Date.now() + timeoutMs;
    let last;
    for (;;) {
      try {
        last = await this.status();
        if (pred(last)) return last;
      } catch (err) {
        last = err;
      }
      if (Date.now() > deadline) {
        throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(last)?.slice(0, 2000)}`);
      }
      await sleep(25);
    }
  }

  /** Waits until the clusters ids (all, if none) are ready and routed (and activated). */
  waitReady(ids, { activated = true, timeoutMs } = {}) {
    return this.waitStatus((st) => {
      const cs = ids ? ids.map((i) => st.clusters[i]) : st.clusters;
      return cs.every((c) => c && c.state === 'ready' && c.routed && (!activated || c.activated));
    }, { timeoutMs, what: `clusters ${ids ?? 'all'} ready` });
  }

  /** The manager's log so far. */
  log() {
    try {
      return fs.readFileSync(this.managerLog, 'utf8');
    } catch {
      return '';
    }
  }

  /** The fixture clusters' event lines (JSON objects), in order. */
  events(filter = {}) {
    let text = '';
    try {
      text = fs.readFileSync(this.eventsFile, 'utf8');
    } catch {
      return [];
    }
    return text.split('\n').filter(Boolean).map((l) => JSON.parse(l))
      .filter((e) => Object.entries(filter).every(([k, v]) => e[k] === v));
  }

  /** Waits until events(filter) has at least n entries, and returns them. */
  async waitEvents(filter, n = 1, timeoutMs = 15_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const evs = this.events(filter);
      if (evs.length >= n) return evs;
      if (Date.now() > deadline) {
        throw new Error(`timed out waiting for ${n} event(s) ${JSON.stringify(filter)}; have ${JSON.stringify(this.events()).slice(-2000)}`);
      }
      await sleep(20);
    }
  }

  /** Pids of every cluster process spawned so far. */
  clusterPids() {
    try {
      return fs.readFileSync(this.pidFile, 'utf8').split('\n').filter(Boolean).map(Number);
    } catch {
      return [];
    }
  }

  /**
   * Stops the manager (SIGTERM, as systemd does: its clusters are quiesced),
   * SIGKILLs what is left of every process group it or its clusters led,
   * closes the test's clients and removes the directory. For after().
   */
  async cleanup({ keep = false } = {}) {
    await Promise.all([...this.clients].map((c) => c.close().catch(() => {})));
    this.clients.clear();
    await this.kill('SIGTERM');
    for (const pid of this.clusterPids()) {
      for (const target of [-pid, pid]) {
        try {
          process.kill(target, 'SIGKILL');
        } catch {
          // exited
        }
      }
    }
    dirs.delete(this.dir);
    if (!keep) fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Whether process pid exists. */
export function processAlive(pid) {
  return alive(pid);
}

/** Waits until pid has exited (polling), at most timeoutMs. */
export async function waitExit(pid, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (alive(pid)) {
    if (Date.now() > deadline) throw new Error(`process ${pid} still alive after ${timeoutMs} ms`);
    await sleep(20);
  }
}

/**
 * A fake Discord REST API answering GET /gateway/bot (and counting the
 * calls), for a manager with a token: its api_base_url is `url`.
 */
export async function startFakeDiscordRest({ url = 'wss://gateway.test.invalid', shards = 4, total = 1000, remaining = 1000, resetAfter = 3_600_000, maxConcurrency = 1 } = {}) {
  const state = { calls: 0, remaining };
  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/api/v10/gateway/bot' && req.headers.authorization?.startsWith('Bot ')) {
      state.calls++;
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({
        url, shards,
        session_start_limit: { total, remaining: state.remaining, reset_after: resetAfter, max_concurrency: maxConcurrency },
      }));
      return;
    }
    res.statusCode = 404;
    res.end('{"message":"404: Not Found","code":0}');
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    state,
    baseURL: `http://127.0.0.1:${port}/api/v10`,
    close: () => new Promise((resolve) => {
      server.closeAllConnections?.();
      server.close(() => resolve());
    }),
  };
}
