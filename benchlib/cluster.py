"""Real ``p2pnode start`` processes: one node (``NodeProc``), a cluster of them (``Cluster``),
and a whole cluster trained until every node is done (``train``).

Tests and benchmarks start nodes the same way, so a node in a test is the node a benchmark
measures. Where a node runs is a *place*: ``place(i) -> (command prefix, host)``; ``loopback``
runs node i on 127.0.0.1, ``benchlib.netns.Topology.place`` inside network namespace i.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchlib.procs import stop
from benchlib.status import fetch_status, free_port, get_json, wait_for

#: node index -> (command prefix, host to listen on and be reached at)
Place = Callable[[int], tuple[list[str], str]]
#: where the repository is: nodes run from it (relative paths in configs resolve there)
ROOT = Path(__file__).resolve().parents[1]


def loopback(i: int) -> tuple[list[str], str]:
    """Every node on this machine's loopback, no command prefix."""
    return [], "127.0.0.1"


class NodeProc:
    """One ``p2pnode start`` process listening on ``host:port``, state in ``root/name``,
    stdout and stderr appended to ``root/name.log`` (kept across restarts)."""

    def __init__(self, root: Path, name: str, args: Sequence[str] = (), seeds: Sequence[str] = (),
                 port: int | None = None, host: str = "127.0.0.1", prefix: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, token: str = "") -> None:
        self.name = name
        self.token = token  #: the read-only credential its status asks for with a cluster secret
        self.port = port or free_port()
        self.addr = f"{host}:{self.port}"
        self.state_dir = root / name
        self.log_path = root / f"{name}.log"
        self.args = list(args)
        self.seeds = list(seeds)
        self.prefix = list(prefix)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        cmd = [*self.prefix, sys.executable, "-m", "p2pnode", "start", "--listen", self.addr,
               "--state-dir", str(self.state_dir), *self.args]
        for seed in self.seeds:
            cmd += ["--seed", seed]
        return cmd

    def start(self) -> NodeProc:
        """Start the process (again, after a stop or a kill: same port, same state dir)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         cwd=ROOT)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def status(self) -> dict[str, Any]:
        """``/v1/status``; raises OSError while the node does not answer."""
        return get_json(self.addr, token=self.token)

    def wait_ready(self, timeout: float = 40.0) -> dict[str, Any]:
        """Wait until the worker runs and the node has joined; that status."""
        return wait_for(lambda: (s := self.status())["training"]["worker_alive"] and s["joined"] and s,
                        timeout, f"{self.name} to be ready")

    def signal(self, sig: int) -> None:
        assert self.proc is not None, f"{self.name} was never started"
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 12.0) -> int | None:
        """SIGTERM (a graceful stop), SIGKILL after ``timeout``; the exit code (None: never started)."""
        return None if self.proc is None else stop(self.proc, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Cluster:
    """``n`` nodes, node 0 the seed of the others; node i listens on port ``port + i`` of its
    place and gets ``args(i)`` (or the same ``args`` for all). A context manager: every node
    is stopped on the way out."""

    def __init__(self, root: Path, n: int, args: Sequence[str] | Callable[[int], Sequence[str]] = (),
                 port: int = 7571, place: Place = loopback, env: Mapping[str, str] | None = None,
                 token: str = "") -> None:
        self.nodes: list[NodeProc] = []
        for i in range(n):
            prefix, host = place(i)
            node_args = args(i) if callable(args) else args
            seeds = [self.nodes[0].addr] if i else []
            self.nodes.append(NodeProc(root, f"node{i}", node_args, seeds, port + i, host, prefix, env, token))

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        return self

    @property
    def addrs(self) -> list[str]:
        return [n.addr for n in self.nodes]

    def statuses(self) -> list[dict[str, Any] | None]:
        """Every node's status, None where it does not answer."""
        return [fetch_status(n.addr, token=n.token) for n in self.nodes]

    def stop(self) -> None:
        for node in self.nodes:  # signal them all first: they leave at the same time
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            node.stop(20.0)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class NodeResult:
    """One node at the end of a training run (``accuracy``: its checkpoint on the whole test set)."""

    node: int
    accuracy: float | None
    train_seconds: float | None
    samples: int | None
    received: int
    exchanges: int
    skipped: int
    clipped: int = 0  #: exchanges averaged in clipped to the robust radius (exchange.robust)
    outliers: int = 0  #: peer models refused as outliers (exchange.robust)
    sync_missed: int = 0  #: exchange.sync: rounds its contribution was not in (late, behind)
    sync_replayed: int = 0  #: exchange.sync: rounds it missed and stepped along afterwards
    #: exchange.sync, on the reducer: each node's average step time, ms (who is not waited for:
    #: sync/lateness.py)
    sync_step_ms: dict[str, float] | None = None
    #: exchange.sync, on the reducer: contributions taken for outliers (exchange.sync_outlier),
    #: and the largest distance of one from its phase's median, in median distances
    sync_outliers: int = 0
    sync_largest_distance: float = 0.0
    node_id: str = ""


@dataclass
class TrainResult:
    """A cluster training run; ``to_json()`` is one JSON-lines record."""

    name: str
    rows: list[NodeResult]
    killed: bool = False
    wall_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  #: the caller's figures (bytes on the wire...)

    @property
    def accuracies(self) -> list[float]:
        return [r.accuracy for r in self.rows if r.accuracy is not None]

    @property
    def min_acc(self) -> float | None:
        return min(self.accuracies) if self.accuracies else None

    @property
    def median_acc(self) -> float | None:
        return statistics.median(self.accuracies) if self.accuracies else None

    @property
    def max_train_s(self) -> float | None:
        secs = [r.train_seconds for r in self.rows if r.train_seconds is not None]
        return max(secs) if secs else None

    @property
    def bytes_received(self) -> int:
        return sum(r.received for r in self.rows)

    def median(self, key: str) -> float:
        """Median of one NodeResult field over the nodes (0 with none)."""
        return statistics.median([getattr(r, key) for r in self.rows]) if self.rows else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "min_acc": self.min_acc, "median_acc": self.median_acc,
                "max_train_s": self.max_train_s, "bytes_received": self.bytes_received, "killed": self.killed,
                "wall_seconds": self.wall_seconds, **self.extra, "rows": [asdict(r) for r in self.rows]}


def evaluated_checkpoints(cfg: Any, state_dirs: Iterable[Any]) -> list[dict[str, float] | None]:
    """Each state dir's final checkpoint evaluated on the whole test set of ``cfg``'s task, as
    the task's metrics (None: no checkpoint there). Loads torch and the data: for reports after
    a run."""
    from p2pnode.checkpoint import CHECKPOINT_NAME, load
    from p2pnode.worker.training import ShardTrainer

    trainer = ShardTrainer(cfg)  # the test split and the model architecture
    out: list[dict[str, float] | None] = []
    for d in state_dirs:
        state = load(Path(d) / CHECKPOINT_NAME)
        if state is None:
            out.append(None)
            continue
        trainer.model.load_state_dict(state["model"])
        trainer.evaluate(0)
        out.append(dict(trainer.metrics))
    return out


def checkpoint_accuracies(state_dirs: Iterable[Path], data_dir: str = "") -> list[float | None]:
    """Each state dir's checkpoint's accuracy on the whole test set of the default config's data,
    read from ``data_dir`` when set (None: no checkpoint there)."""
    from p2pnode.config import Config

    cfg = Config.from_dict({"training": {"data_dir": data_dir}}) if data_dir else Config()
    return [None if m is None else m.get("accuracy", float("nan")) for m in evaluated_checkpoints(cfg, state_dirs)]


def training_args(i: int, nodes: int, samples: int, extra: Sequence[str] = ()) -> list[str]:
    """What every benchmark node runs: Fashion-MNIST, shard i of n, ``samples`` samples with a
    cosine schedule, no periodic evaluation; ``extra`` last (later ``--set`` wins)."""
    return ["--data", "fashion-mnist", "--shard", f"{i}/{nodes}", "--set", f"training.max_samples={samples}",
            "--set", "training.lr_schedule=cosine", "--set", "training.eval_every=0", *extra]


def finished(status: dict[str, Any]) -> bool:
    """Done training and its final evaluation reported: the worker is idle, and stopping the
    node now writes its final checkpoint at once (not after the evaluation of the test set)."""
    t = status["training"]
    agreed = status.get("consensus", {}).get("reached", True)  # the consensus finish, when on
    return bool(t["done"]) and t["eval_step"] >= t["step"] and bool(agreed)


def node_ids(cluster: Cluster, timeout: float = 60.0) -> list[str]:
    """Every node's id, once each answers its status (an id is drawn at a node's first start)."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = cluster.statuses()
        if all(s is not None for s in statuses):
            return [s["node_id"] for s in statuses if s is not None]
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every node answered its status in {timeout:.0f} s")
        time.sleep(0.5)


def train(name: str, workdir: Path, nodes: int, samples: int, extra: Sequence[str] = (), port: int = 7571,
          timeout: float = 900.0, place: Place = loopback, kill_last_at: float = 0.0, restart_after: float = -1.0,
          progress: Callable[[float, list[dict[str, Any] | None]], None] | None = None,
          on_start: Callable[[Cluster], Any] | None = None,
          node_args: Callable[[int], Sequence[str]] | None = None, stagger: float = 0.0,
          data_dir: str = "", kill_reducer: bool = False, ids: Sequence[str] = (),
          node_env: Callable[[int], Mapping[str, str | None]] | None = None,
          evaluate: Callable[[list[Path]], list[float | None]] | None = None, token: str = "") -> TrainResult:
    """Train a fresh cluster in ``workdir/name`` until every live node is done (or ``timeout``),
    then evaluate each node's final checkpoint. ``kill_last_at`` > 0: SIGKILL the last node once
    the others have trained on that fraction of ``samples``; ``restart_after`` >= 0: start it again
    (same state dir: it resumes from its checkpoint) that many seconds later, and wait for it too.
    ``progress(elapsed, statuses)`` is called after every poll (once a second); ``on_start(cluster)``
    once the nodes run (what it returns, if a context manager, is entered then and exited at the end);
    ``node_args(i)``: more arguments for node i alone (after ``extra``); ``stagger`` > 0: node i is
    started ``i * stagger`` seconds after node 0 (machines that come up at different times);
    ``data_dir``: the nodes' and the final evaluation's data folder (``benchlib.testdata``);
    ``kill_reducer``: the node killed is the one with the lowest id (the synchronous mode's
    reducer), not the last; ``ids``: node i's id, written to its state dir before it starts
    (which node holds the lowest: the synchronous mode's reducer); ``node_env(i)``: environment
    variables for node i alone (None: not set, as in a service's environment); ``evaluate(state
    dirs)``: each final checkpoint's figure, for a task other than the built-in one; ``token``: the
    credential the nodes' status asks for (their cluster secret, when they have one)."""
    run = workdir / name
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    for i, node_id in enumerate(ids):
        (run / f"node{i}").mkdir()
        (run / f"node{i}" / "identity.json").write_text(json.dumps({"node_id": node_id, "incarnation": 0}))
    data = ["--data-dir", data_dir] if data_dir else []
    cluster = Cluster(run, nodes, lambda i: [*training_args(i, nodes, samples, [*data, *extra]),
                                             *(node_args(i) if node_args else ())], port, place, token=token)
    for i, node in enumerate(cluster.nodes):
        for key, value in (node_env(i) if node_env else {}).items():
            if value is None:
                node.env.pop(key, None)
            else:
                node.env[key] = value
    last: dict[int, dict[str, Any]] = {}
    killed: int | None = None
    killed_at, restarted = 0.0, False
    #: the node to kill: the last, or (kill_reducer) the lowest id once every node has reported one
    victim: int | None = None if kill_reducer else nodes - 1
    start = time.monotonic()
    pending = list(range(1, nodes)) if stagger > 0 else []
    with contextlib.ExitStack() as hooks:
        if pending:
            hooks.callback(cluster.stop)
            cluster.nodes[0].start()
        else:
            hooks.enter_context(cluster)
        hook = on_start(cluster) if on_start is not None else None
        if hook is not None and hasattr(hook, "__exit__"):
            hooks.enter_context(hook)
        while time.monotonic() - start < timeout:
            while pending and time.monotonic() - start >= pending[0] * stagger:
                cluster.nodes[pending.pop(0)].start()
            statuses = cluster.statuses()
            last.update({i: s for i, s in enumerate(statuses) if s is not None and i != killed})
            if progress is not None:
                progress(time.monotonic() - start, statuses)
            if victim is None and len(last) == nodes:
                ids = [last[i]["node_id"] for i in range(nodes)]
                victim = ids.index(min(ids))
            if kill_last_at and victim is not None and killed is None and not restarted and all(
                    i in last and last[i]["training"]["samples"] >= samples * kill_last_at
                    for i in range(nodes) if i != victim):
                killed = victim
                cluster.nodes[killed].signal(signal.SIGKILL)
                killed_at = time.monotonic()
            if killed is not None and restart_after >= 0 and time.monotonic() - killed_at >= restart_after:
                proc = cluster.nodes[killed].proc
                assert proc is not None
                proc.wait(10)
                cluster.nodes[killed].start()
                last.pop(killed, None)
                killed, restarted = None, True
            if all(i in last and finished(last[i]) for i in range(nodes) if i != killed):
                break
            for i, node in enumerate(cluster.nodes):  # a node that exits unbidden fails the run now, not at timeout
                if i != killed and node.proc is not None and node.proc.poll() is not None:
                    tail = node.log_path.read_text(errors="replace")[-800:] if node.log_path.exists() else ""
                    raise RuntimeError(f"{node.name} exited ({node.proc.returncode}) before training was done:\n{tail}")
            time.sleep(1.0)
    wall = time.monotonic() - start
    live = [i for i in range(nodes) if i != killed]
    dirs = [cluster.nodes[i].state_dir for i in live]
    accs = evaluate(dirs) if evaluate is not None else checkpoint_accuracies(dirs, data_dir)
    rows = []
    for i, acc in zip(live, accs):
        s = last.get(i, {})
        t, ex, b, y = s.get("training", {}), s.get("exchanges", {}), s.get("bytes", {}), s.get("sync", {})
        rows.append(NodeResult(node=i, accuracy=acc, train_seconds=t.get("train_seconds"), samples=t.get("samples"),
                               received=b.get("model_received", 0) + b.get("sync_received", 0), exchanges=ex.get("done", 0),
                               skipped=ex.get("skipped", 0), clipped=ex.get("clipped", 0),
                               outliers=ex.get("outliers", 0), sync_missed=y.get("missed", 0),
                               sync_replayed=y.get("replayed", 0), sync_step_ms=y.get("step_ms") or None,
                               sync_outliers=y.get("outliers", 0),
                               sync_largest_distance=y.get("largest_distance", 0.0),
                               node_id=s.get("node_id", "")))
    return TrainResult(name, rows, killed is not None or restarted, wall)
