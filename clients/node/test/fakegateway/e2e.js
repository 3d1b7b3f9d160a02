// Helpers of the end-to-end tests: a copy of examples/discordjs-bot that
// resolves this package and its dev dependencies, a real sm-manager running
// it (core's test/helpers/manager.js), and the bots' audit logs.

import { mkdtemp, mkdir, readdir, copyFile, symlink, rm, writeFile } from 'node:fs/promises';
import { readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startManager, nodeCommand } from '../helpers/manager.js';

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

/**
 * Starts sm-manager (test/helpers/manager.js, built from this repository)
 * with the example bot's `script` as its cluster command, against the fake
 * gateway `gw`: totalShards shards, perCluster per cluster, the token in
 * DISCORD_TOKEN (discord.token_env), discord.api_base_url at the fake, the
 * default identify spacing and heartbeat interval, and a state directory.
 */
export async function startSm({ gw, bot, token, totalShards, perCluster, script = 'bot.js' }) {
  const m = await startManager({
    stateDir: true,
    env: { DISCORD_TOKEN: token },
    topology: { total_shards: totalShards, shards_per_cluster: perCluster },
    cluster: {
      command: nodeCommand(join(bot.dir, script)),
      dir: bot.dir,
      env: { BOT_EVENT_LOG: bot.logDir, DISCORD_API: gw.apiBaseUrl.replace(/\/v10$/, '') },
    },
    heartbeat: { interval: '1s', timeout: '5s', start_timeout: '30s' },
    deploy: { ready_timeout: '60s', quiesce_timeout: '10s' },
    // The defaults: the spacing of Discord's rule plus the manager's margin.
    discord: { token_env: 'DISCORD_TOKEN', api_base_url: gw.apiBaseUrl, identify_spacing: undefined },
  });
  const client = await m.client();
  const q = JSON.stringify;
  const sm = {
    manager: m,
    status: () => client.status(),
    log: () => m.log(),
    async cluster(id) {
      return (await client.status()).clusters.find((c) => c.id === id);
    },
    async waitAll(pred, ms, what) {
      let last;
      try {
        await waitFor(async () => {
          last = await client.status();
          return last.clusters.length > 0 && last.clusters.every(pred);
        }, ms, what);
      } catch (err) {
        err.message += `\nlast status clusters: ${q(last?.clusters?.map(({ heartbeat, ...c }) => c))}\nmanager log (tail):\n${m.log().split('\n').slice(-60).join('\n')}`;
        throw err;
      }
    },
    deploy: (plan) => client.deploy(plan),
    async waitDeploy(state, ms) {
      await waitFor(async () => (await client.status()).deploy?.state === state, ms, `deploy ${state}`);
    },
    stop: () => m.cleanup({ keep: Boolean(process.env.SM_E2E_KEEP) }),
  };
  return sm;
}
