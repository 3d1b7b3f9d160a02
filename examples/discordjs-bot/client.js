// The same bot on discord.js 14's Client instead of @discordjs/ws. discord.js
// passes only ws.buildIdentifyThrottler and ws.buildStrategy to the
// @discordjs/ws it bundles; clientOptions() uses those to give it the
// manager's identify gate, resume store, gateway information and the
// dispatch gate. Import SimpleShardingStrategy from 'discord.js', not from
// '@discordjs/ws': it must be discord.js's own copy (1.x), not the 2.x one.
import process from 'node:process';
import { Client, Events, GatewayIntentBits, Partials, SimpleShardingStrategy } from 'discord.js';
import { connect } from '@sm-supervisor/client';
import { clientOptions } from '@sm-supervisor/client/discordjs';
import { openEventLog } from './handlers.js';

const sm = await connect();
const client = new Client({
  intents: [GatewayIntentBits.Guilds, GatewayIntentBits.GuildMessages, GatewayIntentBits.DirectMessages, GatewayIntentBits.MessageContent],
  // A process that RESUMEs starts with an empty cache (Discord sends no
  // GUILD_CREATE on RESUME): partials let events of uncached channels through.
  partials: [Partials.Channel, Partials.Message, Partials.GuildMember, Partials.User],
  rest: { api: process.env.DISCORD_API ?? 'https://discord.com/api' },
  ...clientOptions(sm, { buildStrategy: (manager) => new SimpleShardingStrategy(manager) }),
});

const log = openEventLog(process.env.BOT_EVENT_LOG, sm.generation);
const answered = new Set(); // a RESUMEd process may be sent a message again
client.on(Events.ClientReady, (c) => log({ t: 'CLIENT_READY', id: c.user.id, guilds: c.guilds.cache.size }));
client.on(Events.MessageCreate, async (message) => {
  log({ t: 'MESSAGE_CREATE', id: message.id, shard: client.guilds.cache.get(message.guildId)?.shardId ?? null });
  if (message.content !== '!ping' || answered.has(message.id)) return;
  answered.add(message.id);
  await message.channel.send('pong');
});
// The heartbeat fields sm reads (docs/protocol.md#heartbeat-payload-fields):
// summed by sm-api's GET /v1/stats, charted by the status page.
sm.setStats(() => ({
  guilds: client.guilds.cache.size,
  users: client.guilds.cache.reduce((n, g) => n + (g.memberCount || 0), 0),
  ping_ms: client.ws.ping >= 0 ? client.ws.ping : undefined, // -1 until a heartbeat is acknowledged
  memory_bytes: process.memoryUsage().rss,
  heap_bytes: process.memoryUsage().heapUsed,
}));

await client.login(process.env.DISCORD_TOKEN);
