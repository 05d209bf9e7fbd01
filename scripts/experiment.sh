#!/usr/bin/env bash
# The paper's evaluation from a fresh clone, one command (as root: the capped conditions need
# network namespaces): sets up .venv and the data if needed, installs the `bench` extra
# (hivemind, matplotlib) if it is missing, then runs scripts/experiment.py with the arguments
# given (none: the full run, 30-45 minutes on 2 cores by the load, writing docs/experiments/full.jsonl and
# docs/EXPERIMENTS.md with its figures).
#   sudo bash scripts/experiment.sh            # the full run
#   sudo bash scripts/experiment.sh --quick    # the ratio condition, 4 000 samples: 7 minutes at load 3.5-5.4
set -euo pipefail
cd "$(dirname "$0")/.."
P2PNODE_NEED_DATA=1 bash scripts/setup.sh
if ! .venv/bin/python -c "import hivemind, matplotlib" 2>/dev/null; then
  echo "== installing the bench extra (hivemind, matplotlib) into .venv"
  .venv/bin/python -m pip install -q -e '.[bench]' 2>&1 | grep -v "^WARNING: Location" || true
fi
export OMP_NUM_THREADS=1
exec .venv/bin/python scripts/experiment.py "$@"
