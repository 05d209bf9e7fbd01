"""The hivemind baseline: ``hivemind.Optimizer`` (hivemind 1.1.12, the optional ``bench`` extra)
on the same small CNN, shards, batch size, momentum SGD and cosine schedule as
``benchlib.ddp``, one process per worker.

As hivemind's documentation recommends for slow links, each worker applies its own optimizer
step after every batch (``use_local_updates=True``) and the workers average their parameters
every ``target_batch_size`` samples taken together (``average_every`` local steps per worker);
peers find each other through hivemind's DHT (libp2p), rank 0 the first peer.

The learning rate follows p2pnode's recipe (a linear warm-up over ``warmup_samples``, then
cosine) through hivemind's own ``scheduler=`` argument, which hivemind steps once per epoch
(``target_batch_size``): ``Optimizer.param_groups`` hands out *copies* of the inner optimizer's
groups, so setting ``lr`` on them (as this baseline first did) changed nothing and hivemind
trained at lr 0.2 throughout, without warm-up; with no clipping either, a worker's local step
could blow up, and parameter averaging then spread the NaN to every peer (the 300 Mbit/s run of
the quick log). Gradients are clipped at ``grad_clip`` like p2pnode's (its default, 5).
``matchmaking_time`` is 5 s, the top of hivemind's "3-5 s for small local runs", and a group is
formed as soon as every worker has joined (``target_group_size``, a documented averager option):
with local updates hivemind averages parameters in the background, but its next local step waits
for that round (``delta_rule_averaging``), so without a target size every round stalled training
for the whole matchmaking time. The averaging timeout is 15 s (its docs: about twice one
all-reduce, here also covering matchmaking; one round of the CNN took ~1 s): at 30 s, a round
that found no group (a peer an epoch behind or already done) stalled training for 30 s.
Per-step records and the final models go to ``log_dir`` (``benchlib/steplog.py``), as for DDP.

``run_hivemind(HivemindRun(...), place)`` starts rank 0, reads its DHT address from its first
output line, starts the others with it, and returns every rank's result dict (or ``failed``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

from benchlib.cluster import ROOT, Place, loopback
from benchlib.ddp import BATCH, MOMENTUM


@dataclass
class HivemindRun:
    workers: int = 4
    samples: int = 30000  #: training samples per worker
    lr: float = 0.2
    average_every: int = 16  #: local steps per worker between two parameter averages
    matchmaking_time: float = 5.0  #: seconds hivemind waits to gather peers (its docs: 3-5 s, small local runs)
    averaging_timeout: float = 15.0  #: its docs: ~2x one all-reduce; here it also covers the 5 s matchmaking
    warmup_samples: int = 3200  #: per worker: the learning rate rises linearly over these (p2pnode's default)
    grad_clip: float = 5.0  #: largest gradient norm of a local step (p2pnode's default; 0: none)
    log_dir: str = ""
    eval_every: int = 0
    partition: str = "iid"
    partition_seed: int = 0

    @property
    def steps(self) -> int:
        return self.samples // BATCH


def unavailable() -> str:
    """Why hivemind cannot run here ("" when it can)."""
    try:
        import hivemind  # noqa: F401
    except ImportError as exc:
        return f"hivemind is not installed ({exc}); pip install -e '.[bench]'"
    return ""


def run_hivemind(run: HivemindRun, place: Place = loopback, wait: float = 3600.0,
                 env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every rank's result (``seconds``, ``accuracy``, ``steps``...), or one ``failed`` dict."""
    from p2pnode.daemon.supervisor import WORKER_MALLOC_ENV

    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **WORKER_MALLOC_ENV, **(env or {})}
    opts = [a for f in fields(HivemindRun) for a in (f"--{f.name.replace('_', '-')}", str(getattr(run, f.name)))]

    def start(rank: int, peers: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*place(rank)[0], sys.executable, "-m", "benchlib.hivemind_run", "--rank", str(rank),
                                 "--host", place(rank)[1], "--initial-peers", peers, *opts],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=ROOT,
                                start_new_session=True)  # its own process group: hivemind's children go with it

    procs = [start(0, "")]
    deadline = time.monotonic() + wait
    try:
        assert procs[0].stdout is not None
        first = procs[0].stdout.readline()  # rank 0's DHT addresses
        if not first:
            return [{"failed": f"rank 0 exited: {procs[0].communicate(timeout=10)[1][-2000:]}"}]
        peers = ",".join(json.loads(first)["maddrs"])
        procs += [start(r, peers) for r in range(1, run.workers)]
        results = []
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [ln for ln in out.strip().splitlines() if ln.startswith("{")]
            results.append(json.loads(lines[-1]) if lines else {"failed": err[-2000:]})
        return results
    except subprocess.TimeoutExpired:
        return [{"failed": f"no result after {wait:.0f} s: the workers hung"}]
    finally:
        # every rank's whole process group: a hung rank's hivemind processes (its DHT and averager,
        # forked, and their p2pd daemons) outlived a kill of the rank alone, and kept ~0.2 of a
        # core busy through the rest of the 2026-11-25 full run
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def rank_main(run: HivemindRun, rank: int, host: str, initial_peers: list[str]) -> dict[str, Any]:
    import hivemind
    import torch
    import torch.nn.functional as F

    from benchlib.steplog import StepLog, evaluate
    from p2pnode.data import fashion_mnist, shard
    from p2pnode.models import build_model

    torch.set_num_threads(1)
    train = shard(fashion_mnist(True), rank, run.workers, run.partition, run.partition_seed)
    test = fashion_mnist(False)
    torch.manual_seed(0)
    model = build_model("cnn")
    dht = hivemind.DHT(host_maddrs=[f"/ip4/{host}/tcp/0"], initial_peers=initial_peers, start=True)
    if rank == 0:
        print(json.dumps({"maddrs": [str(a) for a in dht.get_visible_maddrs()]}), flush=True)
    opt = hivemind.Optimizer(
        dht=dht, run_id="p2pnode-experiment", batch_size_per_step=BATCH,
        target_batch_size=BATCH * run.workers * run.average_every,
        optimizer=lambda params: torch.optim.SGD(params, lr=run.lr, momentum=MOMENTUM), params=model.parameters(),
        scheduler=lambda inner: torch.optim.lr_scheduler.LambdaLR(inner, lambda epoch: lr_factor(run, epoch)),
        use_local_updates=True, matchmaking_time=run.matchmaking_time, averaging_timeout=run.averaging_timeout,
        averager_opts={"target_group_size": run.workers}, verbose=False)
    steplog = StepLog(run.log_dir, rank, run.eval_every, test)
    barrier(run, "ready", rank)  # a rank that started early would otherwise train alone
    gen = torch.Generator().manual_seed(rank + 1)
    order, pos = torch.randperm(len(train), generator=gen), 0
    start = time.monotonic()
    steplog.begin()
    for step in range(run.steps):
        if pos + BATCH > len(order):
            order, pos = torch.randperm(len(train), generator=gen), 0
        idx = order[pos:pos + BATCH]
        pos += BATCH
        opt.zero_grad()
        loss = F.cross_entropy(model(train.images[idx]), train.labels[idx])
        loss.backward()
        if run.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), run.grad_clip)
        opt.step()
        steplog.step(step + 1, float(loss.detach()), model)
    seconds = time.monotonic() - start
    # Leave the averaging now: a finished peer's averager stays in the DHT and is picked for the
    # others' groups (target_group_size), which then wait out averaging_timeout for a peer that
    # no longer steps: in the first full run, the three slower peers' last ~70 steps took 150-360 s
    # after the fastest finished. Without it they form a group of the peers still training.
    epochs = int(opt.local_epoch)
    opt.shutdown()
    steplog.close(model)
    accuracy = evaluate(model, test)
    barrier(run, "done", rank)  # the peers' last rounds find the DHT nodes up
    dht.shutdown()
    return {"rank": rank, "seconds": seconds, "accuracy": accuracy, "steps": run.steps, "of_steps": run.steps,
            "epochs": epochs, **asdict(run)}


def lr_factor(run: HivemindRun, epoch: int) -> float:
    """The learning rate over ``run.lr`` in hivemind epoch ``epoch`` (``average_every`` local
    steps of each worker): linear warm-up over ``warmup_samples``, then cosine to 0 over the run."""
    samples = BATCH * run.average_every * epoch  # a worker's samples when the epoch begins
    warm = min(1.0, (samples + BATCH * run.average_every) / run.warmup_samples) if run.warmup_samples > 0 else 1.0
    return warm * 0.5 * (1 + math.cos(math.pi * min(1.0, samples / max(1, run.samples))))


def barrier(run: HivemindRun, name: str, rank: int, timeout: float = 600.0) -> None:
    """Wait until every rank has reached ``name`` (files in the shared log folder: the ranks may
    live in different network namespaces, never in different file systems)."""
    import pathlib

    if not run.log_dir:
        return
    folder = pathlib.Path(run.log_dir) / "barrier"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.{rank}").touch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(list(folder.glob(f"{name}.*"))) < run.workers:
        time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description="one hivemind worker (benchlib.hivemind_run.run_hivemind starts them)")
    for f in fields(HivemindRun):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--initial-peers", default="")
    args = ap.parse_args()
    run = HivemindRun(**{f.name: getattr(args, f.name) for f in fields(HivemindRun)})
    peers = [p for p in args.initial_peers.split(",") if p]
    print(json.dumps(rank_main(run, args.rank, args.host, peers)), flush=True)
    sys.stdout.flush()
    os._exit(0)  # hivemind's background processes can hold the interpreter's exit


if __name__ == "__main__":
    sys.exit(main())
