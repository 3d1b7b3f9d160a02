// A sharded Discord bot on @discordjs/ws, run by sm-manager: one process per
// cluster, its shards from the manager, identifies through the manager's gate,
// sessions resumed after a crash, dispatches held until ACTIVATE so that a
// deploy neither loses nor repeats an event. Everything sm-specific is here;
// the bot itself (handlers.js) knows nothing of sm.
import process from 'node:process';
import { REST } from '@discordjs/rest';
import { WebSocketManager } from '@discordjs/ws';
import { GatewayIntentBits } from 'discord-api-types/v10';
import { connect } from '@sm-supervisor/client';
import { attach, webSocketManagerOptions } from '@sm-supervisor/client/discordjs';
import { createBot } from './handlers.js';

const token = process.env.DISCORD_TOKEN; // [discord] token_env = "DISCORD_TOKEN"
const rest = new REST({ api: process.env.DISCORD_API ?? 'https://discord.com/api' }).setToken(token);

// REGISTER with the manager: shard range, resume state, gateway information.
const sm = await connect();
const bot = createBot({ rest, generation: sm.generation, eventLog: process.env.BOT_EVENT_LOG });

const manager = new WebSocketManager(webSocketManagerOptions(sm, {
  token,
  rest, // for everything but GET /gateway/bot, which the manager answers
  intents: GatewayIntentBits.Guilds | GatewayIntentBits.GuildMessages | GatewayIntentBits.MessageContent,
}));

// Dispatches reach the bot from ACTIVATE on (a deploy's new process replays
// what the old one did not handle); ready once every shard is up; on QUIESCE
// the shards close resumably and the process exits.
const gate = attach(sm, manager, bot.onDispatch);
sm.setStats(() => ({ ...bot.stats(), gate: gate.stats() })); // in the manager's status feed
sm.handle('stats', () => bot.stats()); // a business op other processes can ask

await manager.connect();
