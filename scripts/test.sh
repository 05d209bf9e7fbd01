#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the fast suite: every test not marked
# `slow` (about 4 minutes on 2 cores, 2026-11-28; real daemons included, with a torch-free worker where
# training is beside the point).
#   scripts/test.sh --all            everything, the slow real-process tests too (what CI runs)
#   scripts/test.sh tests/test_x.py  the tests named, slow or not
# Other arguments go to pytest, e.g. scripts/test.sh -k cluster -x. P2PNODE_TEST_ALL=1 = --all.
# Tests run on P2PNODE_TEST_JOBS pytest-xdist workers (default 2: most real-daemon tests wait on
# the network, and one at a time left a core idle; the torch clusters keep to one worker, see
# tests/conftest.py); P2PNODE_TEST_JOBS=0 runs them in this process (for pdb).
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests read real Fashion-MNIST (the Debian package dataset-fashion-mnist), as the demo does.
P2PNODE_TEST_TOOLS=1 P2PNODE_NEED_DATA=1 bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

select=(-m "not slow")
[ "${P2PNODE_TEST_ALL:-0}" = 1 ] && select=()
args=()
for arg in "$@"; do
  if [ "$arg" = --all ]; then
    select=()
  else
    [ -e "${arg%%::*}" ] && select=()  # a test file or node id given: run it whatever its marks
    args+=("$arg")
  fi
done
exec .venv/bin/python -m pytest -p no:cacheprovider -q -n "${P2PNODE_TEST_JOBS:-2}" --dist loadgroup \
  "${select[@]}" "${args[@]}"
