#!/usr/bin/env bash
# Start N swarm nodes on 127.0.0.1, each with its own run dir and dashboard; the first bootstraps the rest.
# Node i serves its status API and dashboard on port SWARM_API_PORT+i (default 8770+i; SWARM_API_PORT=0
# picks free ports); the URLs are printed once the nodes are up.
# Ctrl-C (or SIGTERM) stops them all: each finishes its step, checkpoints and shuts its network down.
# Each node runs in its own session (setsid), so the terminal's Ctrl-C reaches only this script, which
# forwards SIGTERM (each node's p2pd runs in a session of its own too). Ctrl-C twice kills.
# Usage: scripts/local_swarm.sh N [key=value ...]     e.g. scripts/local_swarm.sh 3 train.steps=100
set -euo pipefail
N="${1:?usage: scripts/local_swarm.sh N [key=value ...]}"
shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/dev/venv.sh" ""
cd "$ROOT"
BASE="${SWARM_RUNS:-runs/local-swarm}"
API_PORT="${SWARM_API_PORT:-8770}"
mkdir -p "$BASE"
api_port() { if [ "$API_PORT" = 0 ]; then echo 0; else echo $((API_PORT + $1)); fi; }
pids=()
launch() {  # exec, so that $! is the node itself; setsid gives it its own session (Linux)
  if command -v setsid >/dev/null; then exec setsid "$@"; else exec "$@"; fi
}
kill_all() {
  trap - INT TERM
  echo "killing ${#pids[@]} nodes and their p2pd"
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true; done
  exit 130
}
stop() {  # stop [exit code]
  trap kill_all INT TERM
  echo "stopping ${#pids[@]} nodes (each finishes its step and checkpoints; Ctrl-C again kills them)"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait || true
  exit "${1:-0}"
}
trap stop INT TERM
launch "$VENV/bin/swarm-node" start -c configs/tiny-swarm.yaml --run-dir "$BASE/node0" --no-progress seed=0 \
  "api.port=$(api_port 0)" "$@" >"$BASE/node0.log" 2>&1 &
pids+=($!)
addr=""
for _ in $(seq 1 300); do
  addr=$(grep -o -m1 -- '--initial-peers .*' "$BASE/node0.log" 2>/dev/null | cut -d' ' -f2 || true)
  [ -n "$addr" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || { echo "node0 exited:"; tail -5 "$BASE/node0.log"; exit 1; }
  sleep 0.5
done
[ -n "$addr" ] || { echo "node0 printed no address; see $BASE/node0.log"; stop 1; }
echo "node0 at $addr"
for i in $(seq 1 $((N - 1))); do
  launch "$VENV/bin/swarm-node" start -c configs/tiny-swarm.yaml --run-dir "$BASE/node$i" --no-progress \
    --initial-peers "$addr" "seed=$i" "api.port=$(api_port "$i")" "$@" >"$BASE/node$i.log" 2>&1 &
  pids+=($!)
done
for i in $(seq 0 $((N - 1))); do  # each node prints its URL once its API is up
  url=""
  for _ in $(seq 1 300); do
    url=$(grep -o -m1 -- 'status API at [^ ]*' "$BASE/node$i.log" 2>/dev/null | cut -d' ' -f4 || true)
    [ -n "$url" ] && break
    kill -0 "${pids[$i]}" 2>/dev/null || break
    sleep 0.5
  done
  echo "node$i dashboard: ${url:-none (see $BASE/node$i.log)}"
done
echo "$N nodes running; logs and metrics under $BASE/; swarm-node status --run-dir $BASE/node0 (Ctrl-C stops them all)"
wait
