'use strict';
// hybrid-cluster.js: the cluster file hybrid-route.js's ClusterManager forks
// (twice: cluster 0 and cluster 1). It is a bot file as the library's README
// writes one, minus client.login(): a discord.js Client holding a
// ClusterClient. Never logging in means no token, no gateway, no network; the
// ClusterClient's IPC with the manager does not depend on the login, only its
// "ready" hook does, so this file calls triggerReady() itself.
//
// Cluster 1 only answers. Cluster 0 drives the load when the manager sends it
// {smPeerRun: api} and sends back {smPeerResult: {...}}.

const { performance } = require('node:perf_hooks');
const { ClusterClient, getInfo, messageType } = require('discord-hybrid-sharding');
const { Client } = require('discord.js');

const client = new Client({ shards: getInfo().SHARD_LIST, shardCount: getInfo().TOTAL_SHARDS, intents: [] });
client.cluster = new ClusterClient(client);
// No client.login(): see above. A real bot calls this from the 'clientReady' event.
client.cluster.triggerReady();

// The manager went away (it exits without waiting for us): so do we.
process.on('disconnect', () => process.exit(0));

const env = process.env;
const opts = {
    inflight: Number(env.SM_PEER_INFLIGHT),
    payload: Number(env.SM_PEER_PAYLOAD),
    warmupMs: Number(env.SM_PEER_WARMUP_MS),
    durationMs: Number(env.SM_PEER_DURATION_MS),
    drainMs: Number(env.SM_PEER_DRAIN_MS),
};

client.cluster.on('message', msg => {
    if (client.cluster.id === 1 && msg._type === messageType.CUSTOM_REQUEST) {
        // The `request` API's far end: reply with the payload.
        msg.reply({ payload: msg.payload });
        return;
    }
    if (client.cluster.id === 0 && msg.smPeerRun) {
        run(msg.smPeerRun, msg.pids).then(r => client.cluster.send({ smPeerResult: r }));
    }
});

// echoPayload as in bench/route.go: {"data":"xxx…"}, exactly opts.payload bytes as JSON.
function echoPayload(n) {
    const fill = Math.max(n - '{"data":""}'.length, 1);
    return { data: 'x'.repeat(fill) };
}

// The two request/response round trips cluster 0 → manager → cluster 1 → manager → cluster 0.
const calls = {
    // The library's built-in one: the manager routes by the `cluster` option,
    // evaluates the function on cluster 1 with the context, and returns the
    // results as an array (one element for one cluster).
    broadcastEval: payload =>
        client.cluster.broadcastEval((c, ctx) => ctx, { cluster: 1, context: payload }).then(r => r[0]),
    // .request()/.reply(): the manager's 'clientRequest' handler forwards it to
    // cluster 1 with cluster.request() and replies with what comes back.
    request: payload => client.cluster.request({ payload }).then(r => r.payload),
};

// mark writes a line for sm-bench, which samples the processes' CPU at the
// window's edges. This process shares the manager's stdout.
function mark(m) {
    process.stdout.write(JSON.stringify(m) + '\n');
}

async function run(api, pids) {
    const call = calls[api];
    const payload = echoPayload(opts.payload);
    const want = payload.data;
    const lat = [];
    const r = { api, payloadBytes: JSON.stringify(payload).length, sent: 0, ok: 0, errors: 0, badPayload: 0, completed: 0, lost: 0, firstError: '' };
    // The measured window runs from the warm-up timer to the end timer, as
    // they fire: replies inside it are counted, and sm-bench samples CPU then.
    let measuring = false;
    let closed = false;
    let openAt = 0;
    let endAt = 0;
    const openTimer = setTimeout(() => {
        openAt = performance.now();
        measuring = true;
        mark({ mark: 'open', api, pids });
    }, opts.warmupMs);
    const endTimer = setTimeout(() => {
        endAt = performance.now();
        measuring = false;
        closed = true;
        mark({ mark: 'close', api });
    }, opts.warmupMs + opts.durationMs);
    let outstanding = 0;

    async function loop() {
        while (!closed) {
            const t0 = performance.now();
            r.sent++;
            outstanding++;
            let good = false;
            try {
                const got = await call(payload);
                if (got && got.data === want) {
                    r.ok++;
                    good = true;
                } else r.badPayload++;
            } catch (err) {
                r.errors++;
                if (!r.firstError) r.firstError = String((err && err.message) || err);
            }
            outstanding--;
            if (measuring) {
                r.completed++;
                if (good) lat.push((performance.now() - t0) * 1000);
            }
        }
    }

    const loops = Promise.all(Array.from({ length: opts.inflight }, loop));
    let drainTimer;
    const drained = new Promise(resolve => {
        drainTimer = setTimeout(resolve, opts.warmupMs + opts.durationMs + opts.drainMs);
    });
    await Promise.race([loops, drained]);
    clearTimeout(drainTimer);
    clearTimeout(openTimer);
    clearTimeout(endTimer);
    r.lost = outstanding; // still unanswered after the drain
    r.windowMs = endAt - openAt;
    const sorted = Float64Array.from(lat).sort();
    const q = p => (sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] : 0);
    r.p50Us = q(0.5);
    r.p99Us = q(0.99);
    return r;
}
