// End to end, discord.js 14's Client (examples/discordjs-bot/client.js, with
// clientOptions()) under a real sm-manager against the fake gateway: 4 shards
// in 2 clusters. The Client identifies through the manager's gate, never asks
// /gateway/bot, holds its events until ACTIVATE, and after a kill -9 its
// replacement RESUMEs (no IDENTIFY), becomes ready (clientReady, client.user)
// with an empty guild cache, and handles events again.

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeGateway } from './fakegateway/index.js';
import { prepareBot, startSm, readEventLog, waitFor, sleep } from './fakegateway/e2e.js';

const TOKEN = 'ZmFrZQ.fake-token-for-tests.0000000000000000000000001';

describe('discord.js 14 Client under sm-manager', () => {
  let gw;
  let bot;
  let sm;

  before(async () => {
    gw = await startFakeGateway({ token: TOKEN, shards: 4, maxConcurrency: 2, guildsPerShard: 2, heartbeatIntervalMs: 5000, dispatchIntervalMs: 100 });
    bot = await prepareBot();
    sm = await startSm({ gw, bot, token: TOKEN, totalShards: 4, perCluster: 2, script: 'client.js' });
  });

  after(async () => {
    await sm?.stop();
    await gw?.close();
    await bot?.remove();
  });

  const readyOf = (pid) => readEventLog(bot.logDir).find((e) => e.t === 'CLIENT_READY' && e.pid === pid);
  const messagesOf = (pid) => readEventLog(bot.logDir).filter((e) => e.t === 'MESSAGE_CREATE' && e.pid === pid).length;

  test('starts through the gate, kill -9 → RESUME with no IDENTIFY, ready again with an empty guild cache', async () => {
    await sm.waitAll((c) => c.state === 'ready' && c.activated, 60_000, 'both clusters ready and activated');
    const first = await sm.status();
    for (const c of first.clusters) {
      await waitFor(() => readyOf(c.pid) && messagesOf(c.pid) > 5, 20_000, `clientReady and messages in cluster ${c.id}`);
      assert.equal(readyOf(c.pid).guilds, 4, 'the guilds of both shards, from GUILD_CREATE');
    }
    assert.equal(gw.stats().sessionStarts, 4);
    assert.equal(gw.stats().violations, 0);
    assert.equal(gw.stats().gatewayBotCallsFromOthers, 0, 'the Client never asked /gateway/bot');

    await sleep(1500); // the manager has the resume state of every shard
    const old = first.clusters.find((c) => c.id === 1);
    const identifies = gw.identifies.length;
    process.kill(old.pid, 'SIGKILL');
    await sm.waitAll((c) => c.id !== 1 || (c.pid !== old.pid && c.state === 'ready' && c.activated), 30_000, 'cluster 1 respawned');
    const fresh = await sm.cluster(1);
    await waitFor(() => readyOf(fresh.pid) && messagesOf(fresh.pid) > 5, 20_000, 'the resumed Client ready and handling messages');

    assert.deepEqual(gw.resumes.map((r) => [r.shard, r.accepted]).sort(), [[2, true], [3, true]]);
    assert.equal(gw.identifies.length, identifies, 'no IDENTIFY after the kill');
    assert.equal(readyOf(fresh.pid).id, gw.opts.botId, 'client.user is set without a READY from Discord');
    assert.equal(readyOf(fresh.pid).guilds, 0, 'the guild cache starts empty after a RESUME');
    assert.deepEqual(gw.restCalls.map((c) => c.path).sort(), ['/api/v10/applications/@me', '/api/v10/users/@me']);
    assert.equal(gw.stats().gatewayBotCallsFromOthers, 0);
  });
});
