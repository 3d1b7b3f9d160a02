// The bot's own logic, free of sm: build a little state from the gateway and
// answer "!ping". Handlers are idempotent, because a process that RESUMEs a
// session after a crash is sent again the events since the last sequence
// number the manager recorded (up to one heartbeat of them), and the last
// process may already have handled those.
import { openSync, writeSync } from 'node:fs';
import process from 'node:process';
import { Routes } from 'discord-api-types/v10';

const REMEMBERED = 10_000; // message ids kept to skip a replayed one

export function createBot({ rest, generation, eventLog }) {
  const guilds = new Set(); // empty after a RESUME: Discord sends no GUILD_CREATE then
  const answered = new Set();
  const counts = { events: 0, pings: 0 };
  const log = openEventLog(eventLog, generation);

  function onDispatch(payload, shardId) {
    counts.events++;
    log({ t: payload.t, id: payload.d?.id ?? null, shard: shardId, s: payload.s });
    switch (payload.t) {
      case 'GUILD_CREATE':
        guilds.add(payload.d.id);
        break;
      case 'GUILD_DELETE':
        guilds.delete(payload.d.id);
        break;
      case 'MESSAGE_CREATE':
        return ping(payload.d);
      default:
    }
    return undefined;
  }

  async function ping(message) {
    if (message.content !== '!ping' || answered.has(message.id)) return;
    answered.add(message.id);
    if (answered.size > REMEMBERED) answered.delete(answered.values().next().value);
    counts.pings++;
    await rest.post(Routes.channelMessages(message.channel_id), { body: { content: 'pong' } });
  }

  return { onDispatch, stats: () => ({ ...counts, guilds: guilds.size }) };
}

/**
 * An optional audit log in directory `dir`, one JSON line per handled event
 * with the process's pid and generation; the repo's e2e tests read it to
 * check that nothing is lost or handled twice. Written synchronously, so a
 * line is on disk even if the process is killed right after.
 */
export function openEventLog(dir, generation) {
  if (!dir) return () => {};
  const fd = openSync(`${dir}/events-${process.pid}.ndjson`, 'a');
  return (line) => writeSync(fd, `${JSON.stringify({ ...line, pid: process.pid, generation })}\n`);
}
