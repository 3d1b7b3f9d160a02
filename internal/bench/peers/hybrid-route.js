'use strict';
// hybrid-route.js: discord-hybrid-sharding's own cluster → manager → cluster
// request round trip, measured the way `sm-bench route` measures sm's routed
// path (closed loop, N requests in flight, the same 200-byte payload, warm-up
// then a fixed window). See README.md for what it runs and why.
//
//   node hybrid-route.js --inflight=64 [--payload=200] [--warmup-ms=1000]
//        [--duration-ms=5000] [--drain-ms=10000] [--apis=broadcastEval,request]
//
// Prints on stdout one JSON result line per API (with "peer"), each after a
// {"mark":"open",…,"pids":…} and a {"mark":"close",…} line written as its
// measured window opens and closes, so that sm-bench can sample the three
// processes' CPU over it. Exits non-zero if the setup fails; errors and lost
// requests are counted in the result lines, not fatal.

const path = require('node:path');
const { ClusterManager } = require('discord-hybrid-sharding');

const APIS = ['broadcastEval', 'request'];

function parseArgs(argv) {
    const o = { inflight: 1, payload: 200, warmupMs: 1000, durationMs: 5000, drainMs: 10000, apis: APIS };
    for (const arg of argv) {
        const m = /^--([a-z-]+)=(.*)$/.exec(arg);
        if (!m) throw new Error(`bad argument ${arg}`);
        const [, k, v] = m;
        const num = () => {
            const n = Number(v);
            if (!Number.isInteger(n) || n < 0) throw new Error(`--${k}: ${v} is not a non-negative integer`);
            return n;
        };
        switch (k) {
            case 'inflight': o.inflight = Math.max(1, num()); break;
            case 'payload': o.payload = num(); break;
            case 'warmup-ms': o.warmupMs = num(); break;
            case 'duration-ms': o.durationMs = Math.max(1, num()); break;
            case 'drain-ms': o.drainMs = num(); break;
            case 'apis':
                o.apis = v.split(',').map(s => s.trim()).filter(Boolean);
                for (const a of o.apis) if (!APIS.includes(a)) throw new Error(`--apis: unknown API ${a} (have ${APIS})`);
                break;
            default: throw new Error(`unknown flag --${k}`);
        }
    }
    return o;
}

async function main() {
    const o = parseArgs(process.argv.slice(2));
    // The whole run is bounded: start-up, each API's load and drain, and a margin.
    const budget = 30000 + o.apis.length * (o.warmupMs + o.durationMs + o.drainMs + 5000);
    const watchdog = setTimeout(() => fail(new Error(`no result after ${budget} ms`)), budget);

    // The load's settings reach the clusters through their environment, which
    // the clusters copy from this process's. (ClusterManager's clusterData
    // option would be the documented way, but in process mode 3.0.1 forks with
    // `env` set, which replaces clusterData in Child's options.)
    Object.assign(process.env, {
        SM_PEER_INFLIGHT: String(o.inflight),
        SM_PEER_PAYLOAD: String(o.payload),
        SM_PEER_WARMUP_MS: String(o.warmupMs),
        SM_PEER_DURATION_MS: String(o.durationMs),
        SM_PEER_DRAIN_MS: String(o.drainMs),
    });

    const manager = new ClusterManager(path.join(__dirname, 'hybrid-cluster.js'), {
        mode: 'process',
        totalShards: 2, // fixed: 'auto' would ask Discord, which needs a token
        shardsPerClusters: 1, // so two clusters, 0 and 1
        respawn: false,
        token: 'none', // never used: no cluster logs in, and totalShards is fixed
    });
    current = manager;

    // A custom request from cluster 0 (the `request` API) is forwarded to
    // cluster 1 and its reply is passed back: the manager-side routing the
    // library leaves to the user for .request()/.reply().
    manager.on('clientRequest', msg => {
        manager.clusters
            .get(1)
            .request({ payload: msg.payload })
            .then(r => msg.reply({ payload: r.payload }))
            .catch(err => msg.reply({ error: String(err) }));
    });

    const ready = new Set();
    const allReady = new Promise(resolve => {
        manager.on('clusterReady', c => {
            ready.add(c.id);
            if (ready.size === 2) resolve();
        });
    });
    const results = new Map(); // api → resolve
    manager.on('clusterCreate', cluster => {
        cluster.on('message', msg => {
            if (msg.smPeerResult) results.get(msg.smPeerResult.api)?.(msg.smPeerResult);
        });
        cluster.on('death', () => fail(new Error(`cluster ${cluster.id} exited`)));
    });

    // delay 0: the 7 s default spacing protects /gateway/bot, which nothing
    // here calls (the library still prints a warning about it on stderr).
    await manager.spawn({ amount: 2, delay: 0, timeout: -1 });
    await allReady;

    const version = require('discord-hybrid-sharding/package.json').version;
    const djs = require('discord.js').version;
    const pid = id => manager.clusters.get(id).thread.process.pid;
    const pids = { client: pid(0), manager: process.pid, target: pid(1) };
    for (const api of o.apis) {
        const r = await new Promise(resolve => {
            results.set(api, resolve);
            manager.clusters.get(0).send({ smPeerRun: api, pids });
        });
        const line = {
            peer: 'discord-hybrid-sharding',
            version,
            api,
            in_flight: o.inflight,
            req_s: r.windowMs > 0 ? r.completed / (r.windowMs / 1000) : 0,
            p50_us: Math.round(r.p50Us * 10) / 10,
            p99_us: Math.round(r.p99Us * 10) / 10,
            payload_bytes: r.payloadBytes,
            window_s: Math.round(r.windowMs) / 1000,
            requests: r.completed,
            sent: r.sent,
            ok: r.ok,
            errors: r.errors,
            bad_payload: r.badPayload,
            lost: r.lost,
            first_error: r.firstError || undefined,
            mode: manager.mode,
            total_shards: manager.totalShards,
            clusters: manager.clusters.size,
            discord_js: djs,
            node: process.version,
        };
        process.stdout.write(JSON.stringify(line) + '\n');
    }
    clearTimeout(watchdog);
    shutdown(manager, 0);
}

let current = null; // the manager, once made: fail() stops its clusters
function shutdown(manager, code) {
    manager.respawn = false;
    for (const c of manager.clusters.values()) {
        c.removeAllListeners('death');
        c.kill({ reason: 'bench over' });
    }
    process.exitCode = code;
    // Children exit on their IPC channel's disconnect; don't wait for them.
    setImmediate(() => process.exit(code));
}

function fail(err) {
    process.stderr.write(`hybrid-route: ${err && err.stack ? err.stack : err}\n`);
    if (current) shutdown(current, 1);
    else process.exit(1);
}

process.on('SIGTERM', () => fail(new Error('SIGTERM')));
process.on('SIGINT', () => fail(new Error('SIGINT')));
process.on('unhandledRejection', fail);

main().catch(fail);
