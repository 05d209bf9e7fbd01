#!/usr/bin/env bash
# Shared set-up of the README's two commands: a .venv with the package and its test extra,
# and (where apt exists and we are root) the Debian Fashion-MNIST package. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
# Install only when pyproject changed since the last install (a CUDA torch build is ~5 GB).
stamp=.venv/.p2pnode-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || ! .venv/bin/python -c "import p2pnode, torch, torchvision, msgspec" 2>/dev/null; then
  echo "== installing p2pnode and its dependencies into .venv (first time: a few minutes)"
  # A CUDA torch build needs ~6 GB here: say so plainly rather than fail half-way through pip.
  free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
  if [ "${free_kb:-0}" -lt 7000000 ]; then
    echo "warning: only $((free_kb / 1024)) MB free on $(pwd): installing torch needs about 6 GB" >&2
  fi
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # torch/torchvision: this kind of machine keeps wheels on disk that pip picks first.
  # torchvision is the `vision` extra (p2pnode itself runs without it: docs/OPERATIONS.md);
  # the test extra includes it, since the tests train resnet and imagefolder tasks too.
  # Up to 3 tries: a download cut off half-way (seen on CI) is tried again, not taken as final.
  for try in 1 2 3; do
    .venv/bin/python -m pip install -q --retries 10 "torch>=2.4" "torchvision>=0.19" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -m pip install -q --retries 10 -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
    if .venv/bin/python -c "import p2pnode, torch, torchvision, aiohttp, msgpack, msgspec, lz4, uvloop, prometheus_client, rich, playwright, xdist" 2>/dev/null; then
      break
    fi
    [ "$try" = 3 ] || { echo "== install incomplete (try $try of 3): trying again in 10 s" >&2; sleep 10; }
  done
  .venv/bin/python -c "import p2pnode, torch, torchvision, aiohttp, msgpack, msgspec, lz4, uvloop, prometheus_client, rich"
  touch "$stamp"
fi
# benchlib/, the benchmarks' and tests' library, is not in the package (the wheel leaves it out):
# a path file puts the checkout on .venv's sys.path, so that scripts/, the tests and the
# processes they start (DDP ranks, pullers, nodes given a benchlib task) import it.
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
[ "$(cat "$site/p2pnode-checkout.pth" 2>/dev/null)" = "$(pwd)" ] || pwd > "$site/p2pnode-checkout.pth"
# The example task package (examples/charlm, docs/TASKS.md): tests/test_tasks_cluster.py trains it
# as a user would, found through its entry point once installed.
if ! .venv/bin/python -c "import p2pnode_charlm" 2>/dev/null; then
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e ./examples/charlm 2>&1 | grep -v "^WARNING: Location" || true
fi
# The GPT-2-small-shaped example (examples/gpt2): what docs/BENCHMARKS.md's big-model run trains.
if ! .venv/bin/python -c "import p2pnode_gpt2" 2>/dev/null; then
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e ./examples/gpt2 2>&1 | grep -v "^WARNING: Location" || true
fi

# apt's package lists are fetched once a run, by whichever install below comes first (a fresh
# machine needs the data set and the test tools: two fetches of the lists took twice as long)
apt_updated=0
apt_update() {
  [ "$apt_updated" = 1 ] && return 0
  apt-get update -qq >/dev/null && apt_updated=1
}

if [ "${P2PNODE_NEED_DATA:-0}" = 1 ] && [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "== installing Fashion-MNIST (Debian package dataset-fashion-mnist)"
    apt_update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    echo "Fashion-MNIST is missing: run 'sudo apt-get install dataset-fashion-mnist'" >&2
    exit 1
  fi
fi

# The browser and terminal tests (tests/test_dashboard_browser.py, tests/test_status_watch.py)
# drive Debian's chromium (through the playwright client of the test extra: never
# `playwright install`, which downloads a browser) and tmux. Installed where we can; the tests
# skip, saying why, where they are missing.
if [ "${P2PNODE_TEST_TOOLS:-0}" = 1 ] && { [ ! -x /usr/bin/chromium ] || ! command -v tmux >/dev/null; }; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "== installing chromium and tmux (Debian packages) for the dashboard tests"
    apt_update || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium tmux >/dev/null || \
      echo "could not install chromium/tmux: their tests will be skipped" >&2
  else
    echo "chromium or tmux missing (apt-get install chromium tmux): their tests will be skipped" >&2
  fi
fi
# promtool (Debian package prometheus) checks conf/p2pnode-alerts.yml in tests/test_alert_rules.py.
if [ "${P2PNODE_TEST_TOOLS:-0}" = 1 ] && ! command -v promtool >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null || \
      echo "could not install prometheus (promtool): the alert-rule tests will be skipped" >&2
  else
    echo "promtool missing (apt-get install prometheus): the alert-rule tests will be skipped" >&2
  fi
fi
