#!/usr/bin/env bash
# A mesh on one machine (docs/multihost.md): a NATS server with JetStream and
# three sm-managers with different host_ids sharing twelve simulated clusters.
# The Go toolchain is all it needs: nats-server is the module's tool
# (`go tool nats-server`). It prints the fleet (sm-manager -hosts) once every
# cluster is placed, then every 5 s; Ctrl-C (or any exit) stops everything.
#
#   scripts/mesh-demo.sh                 # until Ctrl-C
#   SM_DEMO_ONCE=1 scripts/mesh-demo.sh  # exit once the fleet was shown (tests)
#
# Kill one manager (its pid is printed) and watch the others take its clusters.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d "${TMPDIR:-/tmp}/sm-mesh-demo.XXXXXX")
pids=()
cleanup() {
	trap - EXIT INT TERM
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "building sm-manager, cluster-harness and nats-server (go build, go tool) ..."
go build -o "$work/bin/" ./cmd/sm-manager ./cmd/cluster-harness
nats=$(go tool -n nats-server) # the module's tool, built and cached by go

port=${SM_DEMO_NATS_PORT:-$((20000 + RANDOM % 20000))}
"$nats" -js -a 127.0.0.1 -p "$port" -sd "$work/nats" >"$work/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	grep -q "Server is ready" "$work/nats.log" && break
	sleep 0.1
done
grep -q "Server is ready" "$work/nats.log" || { echo "nats-server did not start:"; cat "$work/nats.log"; exit 1; }
echo "nats-server (JetStream) on nats://127.0.0.1:$port, pid ${pids[0]}"

for host in gw-1 gw-2 gw-3; do
	mkdir -p "$work/$host"
	cat >"$work/$host/sm.toml" <<TOML
socket = "$work/$host/sm.sock"
[topology]
total_shards = 24
shards_per_cluster = 2
[cluster]
command = ["$work/bin/cluster-harness", "--simulate", "--connect-delay=50ms"]
[heartbeat]
interval = "500ms"
[discord]
identify_spacing = "10ms"
[status]
listen = ""
[admin]
listen = ""
[state]
dir = "$work/$host/state"
[mesh]
nats_url = "nats://127.0.0.1:$port"
name = "demo"
host_id = "$host"
max_clusters = 6
lease = "4s"
TOML
	"$work/bin/sm-manager" -config "$work/$host/sm.toml" >"$work/$host/manager.log" 2>&1 &
	pids+=($!)
	echo "sm-manager $host: pid $!, log $work/$host/manager.log"
done

# Wait until the three hosts between them hold all twelve clusters.
show() { "$work/bin/sm-manager" -config "$work/gw-1/sm.toml" -hosts; }
placed=""
for _ in $(seq 300); do
	if out=$(show 2>/dev/null) && grep -q "^3 hosts, 12 of 12 clusters held" <<<"$out"; then
		placed=yes
		break
	fi
	sleep 0.1
done
if [ -z "$placed" ]; then
	echo "the fleet did not form within 30 s:"
	show || true
	tail -n 20 "$work"/gw-*/manager.log
	exit 1
fi
echo
echo "STATUS hosts, as gw-1 sees the fleet:"
show
[ -n "${SM_DEMO_ONCE:-}" ] && exit 0
while sleep 5; do
	echo
	show || true
done
