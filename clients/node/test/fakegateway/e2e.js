// Helpers of the end-to-end tests: a copy of examples/discordjs-bot that
// resolves this package and its dev dependencies, a real sm-manager running
// it (built from this repository), a raw NDJSON client for STATUS and DEPLOY,
// and the bots' audit logs.

import { spawn, execFile } from 'node:child_process';
import { mkdtemp, mkdir, readdir, copyFile, symlink, rm, writeFile, open } from 'node:fs/promises';
import { readdirSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import net from 'node:net';

const here = dirname(fileURLToPath(import.meta.url));
export const packageDir = join(here, '..', '..');
export const repoDir = join(packageDir, '..', '..');
export const exampleDir = join(repoDir, 'examples', 'discordjs-bot');

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Polls pred (may be async) until true; rejects after ms. */
export async function waitFor(pred, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await pred()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(50);
  }
}

/**
 * Copies the example bot into a temporary directory whose node_modules links
 * to this package (as @sm-supervisor/client) and to its installed
 * dependencies, so the example runs exactly as written.
 */
export async function prepareBot() {
  const dir = await mkdtemp(join(tmpdir(), 'sm-e2e-bot-'));
  for (const f of await readdir(exampleDir)) {
    if (f.endsWith('.js')) await copyFile(join(exampleDir, f), join(dir, f));
  }
  await writeFile(join(dir, 'package.json'), JSON.stringify({ type: 'module', private: true }));
  const nm = join(dir, 'node_modules');
  await mkdir(join(nm, '@sm-supervisor'), { recursive: true });
  await symlink(packageDir, join(nm, '@sm-supervisor', 'client'), 'dir');
  for (const entry of readdirSync(join(packageDir, 'node_modules'))) {
    if (entry.startsWith('.')) continue;
    await symlink(join(packageDir, 'node_modules', entry), join(nm, entry), 'dir');
  }
  const logDir = join(dir, 'events');
  await mkdir(logDir);
  return { dir, logDir, remove: () => rm(dir, { recursive: true, force: true }) };
}

/** Every line of the bots' audit logs, all processes. */
export function readEventLog(logDir) {
  const out = [];
  for (const f of readdirSync(logDir)) {
    for (const line of readFileSync(join(logDir, f), 'utf8').split('\n')) {
      if (line) out.push(JSON.parse(line));
    }
  }
  return out;
}

/** Per identify bucket, the gaps between accepted IDENTIFYs: {min, gaps}. */
export function bucketGaps(identifies) {
  const byBucket = new Map();
  for (const i of identifies) byBucket.set(i.bucket, [...(byBucket.get(i.bucket) ?? []), i.at]);
  const gaps = [];
  for (const ats of byBucket.values()) {
    ats.sort((a, b) => a - b);
    for (let k = 1; k < ats.length; k++) gaps.push(ats[k] - ats[k - 1]);
  }
  return { min: gaps.length ? Math.min(...gaps) : Infinity, gaps };
}

let built = null;
/** Builds sm-manager from this repository once per test process. */
export function buildManager() {
  built ??= (async () => {
    const bin = await mkdtemp(join(tmpdir(), 'sm-e2e-bin-'));
    const out = join(bin, 'sm-manager');
    await new Promise((resolve, reject) => {
      execFile('go', ['build', '-o', out, './cmd/sm-manager'], { cwd: repoDir }, (err, _o, stderr) => (err ? reject(new Error(`go build: ${stderr || err.message}`)) : resolve()));
    });
    return out;
  })();
  return built;
}

/** A raw client connection: call(frame) resolves with the REPLY. */
export async function rawClient(socket) {
  const conn = net.connect(socket);
  await new Promise((resolve, reject) => { conn.once('connect', resolve); conn.once('error', reject); });
  const pending = new Map();
  let buf = '';
  let next = 1;
  conn.setEncoding('utf8');
  conn.on('data', (chunk) => {
    buf += chunk;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const frame = JSON.parse(buf.slice(0, i));
      buf = buf.slice(i + 1);
      const p = pending.get(frame.id);
      if (frame.op === 'REPLY' && p) {
        pending.delete(frame.id);
        if (frame.error) p.reject(Object.assign(new Error(`${frame.error.code}: ${frame.error.message}`), { code: frame.error.code }));
        else p.resolve(frame.payload);
      }
    }
  });
  conn.on('error', () => {});
  conn.on('close', () => {
    for (const p of pending.values()) p.reject(new Error('connection closed'));
    pending.clear();
  });
  const call = (frame) => new Promise((resolve, reject) => {
    const id = `e2e-${next++}`;
    pending.set(id, { resolve, reject });
    conn.write(`${JSON.stringify({ ...frame, id })}\n`);
  });
  await call({ op: 'REGISTER', role: 'client', name: 'e2e' });
  return { call, close: () => conn.destroy() };
}

/**
 * Starts sm-manager with the example bot as its cluster command, against the
 * fake gateway `gw`: totalShards shards, perCluster per cluster, the token in
 * DISCORD_TOKEN (discord.token_env), discord.api_base_url at the fake, the
 * default identify spacing, and `command` (default: the bot's bot.js).
 */
export async function startSm({ gw, bot, token, totalShards, perCluster, script = 'bot.js' }) {
  const binary = await buildManager();
  const dir = await mkdtemp(join(tmpdir(), 'sm-e2e-'));
  const socket = join(dir, 'sm.sock');
  const q = JSON.stringify;
  const config = `
socket = ${q(socket)}
log_level = "debug"

[topology]
total_shards = ${totalShards}
shards_per_cluster = ${perCluster}

[cluster]
command = [${q(process.execPath)}, ${q(join(bot.dir, script))}]
dir = ${q(bot.dir)}

[cluster.env]
BOT_EVENT_LOG = ${q(bot.logDir)}
DISCORD_API = ${q(gw.apiBaseUrl.replace(/\/v10$/, ''))}

[restart]
backoff_min = "100ms"
backoff_max = "1s"
stop_grace = "3s"

[state]
dir = ${q(join(dir, 'state'))}

[status]
listen = ""

[admin]
listen = ""

[discord]
token_env = "DISCORD_TOKEN"
api_base_url = ${q(gw.apiBaseUrl)}
`;
  const configPath = join(dir, 'sm.toml');
  await writeFile(configPath, config);
  const logPath = join(dir, 'manager.log');
  const logFile = await open(logPath, 'w');
  const env = { ...process.env, DISCORD_TOKEN: token };
  for (const k of Object.keys(env)) if (k.startsWith('SM_')) delete env[k];
  const child = spawn(binary, ['-config', configPath], { env, stdio: ['ignore', logFile.fd, logFile.fd] });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  const pids = new Set();
  let client = null;

  const status = async () => {
    client ??= await rawClient(socket);
    const s = await client.call({ op: 'STATUS' });
    for (const c of s.clusters ?? []) if (c.pid) pids.add(c.pid);
    return s;
  };
  await waitFor(async () => {
    if (child.exitCode !== null) throw new Error(`sm-manager exited ${child.exitCode}:\n${readFileSync(logPath, 'utf8')}`);
    return existsSync(socket) && (await status().then(() => true, () => { client?.close(); client = null; return false; }));
  }, 30_000, 'sm-manager to answer STATUS');

  const sm = {
    dir, socket, configPath, logPath, status,
    log: () => readFileSync(logPath, 'utf8'),
    async cluster(id) {
      return (await status()).clusters.find((c) => c.id === id);
    },
    async waitAll(pred, ms, what) {
      let last;
      try {
        await waitFor(async () => {
          last = await status();
          return last.clusters.length > 0 && last.clusters.every(pred);
        }, ms, what);
      } catch (err) {
        err.message += `\nlast status clusters: ${q(last?.clusters?.map(({ heartbeat, ...c }) => c))}\nmanager log (tail):\n${sm.log().split('\n').slice(-60).join('\n')}`;
        throw err;
      }
    },
    deploy: (opts = {}) => status().then(() => client.call({ op: 'DEPLOY', ...opts })),
    async waitDeploy(state, ms) {
      await waitFor(async () => (await status()).deploy?.state === state, ms, `deploy ${state}`);
    },
    async stop() {
      client?.close();
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 15_000);
        await exited;
        clearTimeout(t);
      }
      await logFile.close();
      // Anything the manager left behind (it should leave nothing).
      for (const pid of pids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone already
        }
      }
      if (!process.env.SM_E2E_KEEP) await rm(dir, { recursive: true, force: true });
    },
  };
  return sm;
}
