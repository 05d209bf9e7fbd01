#!/usr/bin/env bash
# The demo: a 4-node p2pnode cluster on loopback training the small CNN on real Fashion-MNIST.
# Sets up .venv and the data if needed, starts 4 real `p2pnode start` processes (each on its own
# quarter of the training set), shows a live line per node, stops them when training is done (or
# after DEMO_TIMEOUT seconds), and prints a per-node table with each node's final test accuracy.
#
# Knobs (environment): DEMO_NODES (4), DEMO_SAMPLES per node (30000), DEMO_TIMEOUT (540 s),
# DEMO_PORT (first port, 7471), DEMO_ARGS (extra `p2pnode start` arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
P2PNODE_NEED_DATA=1 bash scripts/setup.sh

NODES=${DEMO_NODES:-4}
SAMPLES=${DEMO_SAMPLES:-30000}
TIMEOUT=${DEMO_TIMEOUT:-540}
PORT=${DEMO_PORT:-7471}
RUN=${DEMO_DIR:-run/demo}
rm -rf "$RUN"
mkdir -p "$RUN"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

addrs=()
for ((i = 0; i < NODES; i++)); do
  addr="127.0.0.1:$((PORT + i))"
  addrs+=("$addr")
  seed=()
  [ "$i" -gt 0 ] && seed=(--seed "127.0.0.1:$PORT")
  # the demo knows its cluster's size: every node waits for the others and all take their first
  # step together (training.min_peers), instead of waiting out the settle window for latecomers
  # shellcheck disable=SC2086
  .venv/bin/p2pnode start --listen "$addr" --state-dir "$RUN/node$i" --data fashion-mnist \
    --shard "$i/$NODES" "${seed[@]}" \
    --set training.max_samples="$SAMPLES" --set training.lr_schedule=cosine \
    --set training.eval_every=0 --set training.min_peers="$((NODES - 1))" ${DEMO_ARGS:-} 2>"$RUN/node$i.log" &
  pids+=($!)
done
echo "started $NODES nodes: ${addrs[*]} (logs in $RUN/)"

.venv/bin/python scripts/demo_watch.py --timeout "$TIMEOUT" --out "$RUN/status.json" "${addrs[@]}"
cleanup
pids=()
.venv/bin/python scripts/demo_report.py --status "$RUN/status.json" "$RUN"/node*/
