#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the whole suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k cluster -x
set -euo pipefail
cd "$(dirname "$0")/.."
P2PNODE_TEST_TOOLS=1 bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -p no:cacheprovider -q "$@"
