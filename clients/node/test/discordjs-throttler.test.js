// identifyThrottler against a real sm-manager whose session budget is spent:
// @discordjs/ws sends an IDENTIFY anyway when waitForIdentify rejects for
// any reason but its signal, so a `budget_refused` must be waited out (asked
// again every retryMs) and only an abort may end the wait. (That an abort
// during an ask withdraws it with IDENTIFY_CANCEL is the core's, tested in
// core-identify.test.js.)

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { startFakeGateway } from './fakegateway/index.js';
import { prepareBot, startSm, readEventLog, waitFor } from './fakegateway/e2e.js';

const TOKEN = 'ZmFrZQ.fake-token-for-tests.0000000000000000000000002';

// A cluster process that only waits for an identify slot for its first shard
// and logs what happens.
const SCRIPT = `
import process from 'node:process';
import { connect } from '@sm-supervisor/client';
import { identifyThrottler } from '@sm-supervisor/client/discordjs';
import { openEventLog } from './handlers.js';

const sm = await connect();
const log = openEventLog(process.env.BOT_EVENT_LOG, sm.generation);
const throttler = identifyThrottler(sm, { retryMs: 300, logger: { warn: (message) => log({ t: 'WARN', message }) } });
const aborter = new AbortController();
sm.handle('abort', () => aborter.abort());
log({ t: 'ASK', remaining: sm.gateway?.session_start_limit?.remaining });
throttler.waitForIdentify(sm.shardIds[0], aborter.signal).then(
  () => log({ t: 'GRANTED' }),
  (err) => log({ t: 'REJECTED', name: err?.name }),
);
sm.setReady(true);
`;

let gw;
let bot;
let sm;

before(async () => {
  gw = await startFakeGateway({ token: TOKEN, shards: 2, remaining: 0, dispatchIntervalMs: 0 });
  bot = await prepareBot();
  await writeFile(join(bot.dir, 'wait-identify.js'), SCRIPT);
  sm = await startSm({ gw, bot, token: TOKEN, totalShards: 2, perCluster: 2, script: 'wait-identify.js' });
});

after(async () => {
  await sm?.stop();
  await gw?.close();
  await bot?.remove();
});

test('a budget refusal is waited out, never a rejection; only an abort ends the wait', async () => {
  await sm.waitAll((c) => c.state === 'ready', 20_000, 'the cluster ready');
  const events = () => readEventLog(bot.logDir);
  await waitFor(() => events().filter((e) => e.t === 'WARN').length >= 3, 10_000, 'three refusals');
  const warns = events().filter((e) => e.t === 'WARN');
  for (const w of warns) assert.match(w.message, /refused \(budget_refused: session start budget exhausted/);
  assert.deepEqual(events().filter((e) => e.t === 'GRANTED' || e.t === 'REJECTED'), [], 'still waiting');
  assert.equal(events().find((e) => e.t === 'ASK').remaining, 0, 'the REGISTER reply said so');

  const client = await sm.manager.client();
  await client.request(0, 'abort', null);
  await waitFor(() => events().some((e) => e.t === 'REJECTED'), 5000, 'the rejection');
  assert.equal(events().find((e) => e.t === 'REJECTED').name, 'AbortError');
  assert.ok(!events().some((e) => e.t === 'GRANTED'));
  await waitFor(async () => (await sm.status()).discord.identify_waiting === 0, 5000, 'nothing waiting in the gate');
  assert.equal(gw.identifies.length, 0, 'no IDENTIFY reached the gateway');
});
