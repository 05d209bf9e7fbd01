"""Model size: the exchange path of 1M to 350M parameters, on loopback and on shaped links.

The nodes train ``benchlib.sizetask`` (square linear layers side by side, batch 1: a step costs
a few matrix-vector products, so the time goes to publishing, fetching, decoding and applying
models). Per size and link, with the p2pnode defaults otherwise:

- exchanges done per node per minute over a measured window, and each node's longest time
  without a completed exchange in it;
- a delta fetch's goodput: a peer-like ``GET /v1/model?since=V-1`` of node 0's newest delta,
  made from node 1's place while the cluster trains, body bytes ÷ seconds (request to last
  byte), as a share of the raw link rate;
- a snapshot fetch's time, the same way, against size ÷ link rate: once the bootstraps are done
  (beside the replicas' first snapshots) and again after the window (beside deltas only);
- peak RSS per node (daemon + worker, ``VmHWM`` of each, summed; the node with the highest, and
  its two parts in GB) against the model's float32 bytes, and the highest of the two sampled
  together every 0.2 s (anonymous and file pages: the sum of peaks bounds a node's peak from
  above, the samples from below); the daemon's longest event-loop stall (status ``event_loop``); SWIM suspicions;
- checkpoint write time (the worker's log) and resume: the last node stopped (SIGTERM, final
  checkpoint) and started again, seconds until its worker runs and until it exchanges again.

Anchors in the same run, on the same link: the raw link rate (``benchlib.linkprobe``: a plain
socket copy of the model's float32 bytes from node 0's place to node 1's) and DDP's all-reduce
of a tensor that size over gloo (``benchlib.allreduce_anchor``), seconds per round.

    sudo nice -n 5 .venv/bin/python scripts/bench_model_size.py --sizes 1M 17M --links loopback [--write]

Links other than ``loopback`` are tc rates (``1gbit``, ``100mbit``): every node in its own
network namespace (benchlib.netns), its veth limited both ways. One configuration runs at a
time; a case stops early, its nodes killed, if the machine's available memory falls below
``--min-free-gb``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib.allreduce_anchor import run_allreduce  # noqa: E402
from benchlib.cluster import ROOT, Cluster, Place, loopback  # noqa: E402
from benchlib.netns import Topology, unavailable  # noqa: E402
from benchlib.nodeprobe import RssSampler, log_seconds, mem_available, metric_sum, metrics, peak_rss  # noqa: E402
from benchlib.procs import stop  # noqa: E402
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section  # noqa: E402
from benchlib.sizetask import shape_for  # noqa: E402
from benchlib.status import fetch_status, wait_for  # noqa: E402

SECTION = "## Model size: the exchange path from 1M to 350M parameters"
SIZES = {"1M": 1_000_000, "17M": 17_000_000, "124M": 124_000_000, "350M": 350_000_000}
RATES = {"loopback": None, "1gbit": 1e9, "100mbit": 1e8}


def probe(place: Place, i: int, *args: str, timeout: float = 900.0) -> dict[str, Any]:
    """One ``benchlib.linkprobe`` command run at node ``i``'s place; its JSON line."""
    cmd = [*place(i)[0], sys.executable, "-m", "benchlib.linkprobe", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"failed": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def raw_copy(place: Place, nbytes: int, port: int = 29377) -> dict[str, Any]:
    """A plain socket copy of ``nbytes`` from node 0's place to node 1's."""
    cmd = [*place(0)[0], sys.executable, "-m", "benchlib.linkprobe", "serve", "--port", str(port),
           "--bytes", str(nbytes)]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        server.stdout.readline()  # listening
        return probe(place, 1, "copy", "--addr", f"{place(0)[1]}:{port}")
    finally:
        stop(server, 5.0)  # type: ignore[arg-type]


def node_args(params: int, i: int, n: int, extra: list[str]) -> list[str]:
    return ["--shard", f"{i}/{n}", "--set", "training.task=benchlib.sizetask:task", "--set", f"task.params={params}",
            "--set", "training.batch_size=1", "--set", "training.lr=0.01", "--set", "training.eval_every=0",
            "--set", "training.warmup_samples=0", "--set", "checkpoint.interval=20", *extra]


class Watch:
    """Polls every node while the window runs: exchanges, loop stalls, memory left."""

    def __init__(self, cluster: Cluster, min_free: int) -> None:
        self.cluster = cluster
        self.min_free = min_free
        self.last_change: list[float] = []
        self.last_done: list[int] = []
        self.longest_gap: list[float] = []
        self.low_memory = False
        self.polled_at = 0.0

    def start(self) -> None:
        now = time.monotonic()
        self.last_change = [now] * len(self.cluster.nodes)
        self.last_done = [self.done(s) for s in self.cluster.statuses()]
        self.longest_gap = [0.0] * len(self.cluster.nodes)

    @staticmethod
    def done(s: dict[str, Any] | None) -> int:
        return -1 if s is None else int(s["exchanges"]["done"])

    def poll(self) -> list[dict[str, Any] | None]:
        now = self.polled_at = time.monotonic()
        statuses = self.cluster.statuses()
        for i, s in enumerate(statuses if self.last_done else []):
            d = self.done(s)
            if d > self.last_done[i] >= 0 or (d >= 0 > self.last_done[i]):
                self.last_done[i], self.last_change[i] = d, now
            self.longest_gap[i] = max(self.longest_gap[i], now - self.last_change[i])
        if mem_available() < self.min_free:
            self.low_memory = True
        return statuses

    def poll_every(self, every: float = 2.0) -> None:
        """A poll if the last was ``every`` seconds ago: the gaps are measured while the delta
        fetches run too (at 100 Mbit/s they take most of the window; polled only at their
        start and end, a node's gap read 0 s whenever it had exchanged once in between)."""
        if time.monotonic() - self.polled_at >= every:
            self.poll()

    def run_for(self, seconds: float, every: float = 2.0) -> list[dict[str, Any] | None]:
        end = time.monotonic() + seconds
        statuses = self.poll()
        while time.monotonic() < end and not self.low_memory:
            time.sleep(min(every, max(0.0, end - time.monotonic())))
            statuses = self.poll()
        return statuses


def delta_fetches(cluster: Cluster, place: Place, count: int, watch: Watch) -> list[dict[str, Any]]:
    """Node 0's newest delta, fetched ``count`` times from node 1's place (a new one each time);
    ``watch`` keeps polling the nodes meanwhile."""
    out = []
    seen = -1
    for _ in range(count):
        try:
            s = wait_for(lambda: watch.poll_every() or (st := fetch_status(cluster.nodes[0].addr)) and
                         st["training"]["published_version"] > max(seen, 1) and st, 60, "a new publish")
        except AssertionError:
            break
        v, epoch = s["training"]["published_version"], s["training"]["epoch"]
        seen = v
        got = probe(place, 1, "fetch", "--addr", cluster.nodes[0].addr, "--query", f"since={v - 1}&epoch={epoch}")
        out.append(got)
    return out


def run_case(size: str, link: str, place: Place, n: int, window: float, workdir: Path, port: int,
             min_free: int, extra: list[str], resume_wait: float = 300.0, keep_state: bool = False) -> dict[str, Any]:
    params = SIZES[size]
    width, layers = shape_for(params)
    numel = width * width * layers
    dense = 4 * numel
    rec: dict[str, Any] = {"size": size, "link": link, "nodes": n, "params": numel, "dense_bytes": dense}
    raw = raw_copy(place, dense)
    rec["raw"] = raw
    rate = raw["bytes"] / raw["seconds"] if "seconds" in raw else None
    rec["raw_rate"] = rate
    print(f"  raw copy: {raw}", flush=True)
    root = workdir / f"{size}-{link}"
    shutil.rmtree(root, ignore_errors=True)  # an earlier run's checkpoints would be resumed
    root.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(root, n, lambda i: node_args(params, i, n, extra), port=port, place=place)
    sampler: RssSampler | None = None
    try:
        # the seed first: the others join it once it serves (and take its model: the bootstrap)
        began = time.monotonic()
        cluster.nodes[0].start()
        watch = Watch(cluster, min_free)
        try:
            cluster.nodes[0].wait_ready(300)
            rec["seed_ready_s"] = time.monotonic() - began
            joined_at = time.monotonic()
            for node in cluster.nodes[1:]:
                node.start()
            sampler = RssSampler([nd.pid for nd in cluster.nodes]).__enter__()
            wait_for(lambda: all(s and s["training"]["worker_alive"] and s["joined"] and s["training"]["step"] > 0
                                 for s in watch.poll()) and not watch.low_memory or watch.low_memory,
                     600, "every node training")
        except AssertionError as exc:
            rec["failed"] = str(exc)[:300]
            return rec
        if watch.low_memory:
            rec["failed"] = "stopped: the machine's available memory fell below the floor while starting"
            return rec
        rec["start_s"] = time.monotonic() - began
        rec["others_training_s"] = time.monotonic() - joined_at
        # the others train on their own model until their bootstrap settles (a peer's model
        # adopted, or their own kept): measured before that, the snapshot fetch and the window
        # shared node 0's link with the others' bootstrap snapshots (at 100 Mbit/s, 4 of them)
        try:
            wait_for(lambda: all(s and s["bootstrap"]["state"] != "pending" for s in watch.poll()[1:])
                     or watch.low_memory, 900, "the others' bootstrap", interval=2.0)
            rec["others_bootstrapped_s"] = time.monotonic() - joined_at
        except AssertionError as exc:
            rec["bootstrap_failed"] = str(exc)[:300]
        boots = [s["bootstrap"] if s else None for s in cluster.statuses()]
        rec["bootstrap"] = boots
        snap = probe(place, 1, "fetch", "--addr", cluster.nodes[0].addr)
        rec["snapshot_fetch"] = snap
        print(f"  snapshot fetch: {snap}", flush=True)
        watch.start()
        t0 = time.monotonic()
        first = watch.poll()
        m0 = [metrics(nd.addr) for nd in cluster.nodes]
        rec["delta_fetches"] = delta_fetches(cluster, place, 3, watch)
        print(f"  delta fetches: {rec['delta_fetches']}", flush=True)
        last = watch.run_for(window - (time.monotonic() - t0))
        span = time.monotonic() - t0
        m1 = [metrics(nd.addr) for nd in cluster.nodes]
        rec["window_s"] = span
        rec["low_memory"] = watch.low_memory
        rec["exchanges_per_min"] = [None if a is None or b is None else
                                    60 * (b["exchanges"]["done"] - a["exchanges"]["done"]) / span
                                    for a, b in zip(first, last)]
        rec["longest_gap_s"] = watch.longest_gap
        rec["steps_per_min"] = [None if a is None or b is None else
                                60 * (b["training"]["step"] - a["training"]["step"]) / span for a, b in zip(first, last)]
        rec["loop_lag_max_s"] = [s["event_loop"]["lag_max_s"] if s and "event_loop" in s else None for s in last]
        rec["loop_lag_split"] = [s["event_loop"].get("lag_max_split") if s and "event_loop" in s else None
                                 for s in last]
        # the window's own stalls (the longest above is since the daemon started: its bootstrap,
        # four workers importing torch and building their models at once): probes late by more
        # than 100 ms and 250 ms in the window, of all its probes (the lag histogram's buckets)
        lag = "p2pnode_event_loop_lag_seconds"
        rec["window_probes"] = [b.get(f"{lag}_count", 0) - a.get(f"{lag}_count", 0) for a, b in zip(m0, m1)]
        rec["window_stalls"] = [
            {f">{le}": (b.get(f"{lag}_count", 0) - b.get(f'{lag}_bucket{{le={le}}}', 0))
             - (a.get(f"{lag}_count", 0) - a.get(f'{lag}_bucket{{le={le}}}', 0)) for le in ("0.1", "0.25")}
            for a, b in zip(m0, m1)]
        rec["suspicions"] = [metric_sum(b, "p2pnode_membership_suspicions_total") for b in m1]
        rec["exchange_bytes"] = [metric_sum(b, "p2pnode_exchange_received_bytes_total")
                                 - metric_sum(a, "p2pnode_exchange_received_bytes_total") for a, b in zip(m0, m1)]
        rec["exchange_seconds"] = [metric_sum(b, "p2pnode_exchange_duration_seconds_sum")
                                   - metric_sum(a, "p2pnode_exchange_duration_seconds_sum") for a, b in zip(m0, m1)]
        rec["exchange_results"] = [{k.split("result=")[1].rstrip("}"): v - a.get(k, 0) for k, v in b.items()
                                    if k.startswith("p2pnode_exchanges_total{") and v - a.get(k, 0)}
                                   for a, b in zip(m0, m1)]
        rec["peak_rss"] = [peak_rss(nd.pid) for nd in cluster.nodes]
        if sampler is not None:
            sampler.__exit__()
            rec["sampled_rss"] = sampler.peaks  # per node: (total, anonymous, file) at its highest sample
        print(f"  window: {json.dumps({k: rec[k] for k in ('exchanges_per_min', 'loop_lag_max_s', 'loop_lag_split', 'peak_rss')})}",
              flush=True)
        if watch.low_memory:
            rec["failed"] = "stopped: the machine's available memory fell below the floor"
            return rec
        # again once every replica exists (after the window): the first fetch shared node 0's
        # link with the replicas' first snapshots (at 100 Mbit/s, minutes of them), this one
        # with the cluster's deltas only
        rec["snapshot_fetch_settled"] = probe(place, 1, "fetch", "--addr", cluster.nodes[0].addr)
        print(f"  snapshot fetch, settled: {rec['snapshot_fetch_settled']}", flush=True)
        # resume: the last node stopped (final checkpoint) and started again
        last_node = cluster.nodes[-1]
        t = time.monotonic()
        last_node.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        last_node.stop(60.0)
        rec["stop_s"] = time.monotonic() - t
        done_before = 0
        t = time.monotonic()
        last_node.start()
        try:
            s = wait_for(lambda: (st := last_node.status())["training"]["worker_alive"] and st, 600, "the resume")
            rec["resume_s"] = time.monotonic() - t
            rec["resumed"] = s["training"]["resumed"]
            done_before = s["exchanges"]["done"]
            wait_for(lambda: last_node.status()["exchanges"]["done"] > done_before, resume_wait,
                     "an exchange after resume")
            rec["exchanging_again_s"] = time.monotonic() - t
        except AssertionError as exc:
            rec["resume_failed"] = str(exc)[:300]
        logs = [nd.log() for nd in cluster.nodes]
        rec["checkpoint_write_s"] = [log_seconds(text, r"checkpoint at step \d+ written in ([\d.]+) s") for text in logs]
        rec["checkpoint_load_s"] = log_seconds(logs[-1], r"checkpoint loaded in ([\d.]+) s")
        rec["checkpoint_failures"] = sum(text.count("checkpoint did not complete") + text.count("checkpoint failed")
                                         for text in logs)
        rec["checkpoint_bytes"] = (last_node.state_dir / "checkpoint.pt").stat().st_size \
            if (last_node.state_dir / "checkpoint.pt").exists() else None
    finally:
        if sampler is not None:
            sampler.__exit__()
        cluster.stop()
        if not keep_state:  # checkpoints and replica files: 12 GB a case at 124M on 4 nodes (the logs stay)
            for node in cluster.nodes:
                shutil.rmtree(node.state_dir, ignore_errors=True)
    return rec


def ddp_anchor(rec: dict[str, Any], place: Place, n: int, rounds: int, env: dict[str, str]) -> None:
    got = run_allreduce(rec["params"], n, rounds, place, env=env)
    rec["allreduce"] = got
    print(f"  all-reduce: {got}", flush=True)


def fmt_s(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2f} s" if x < 10 else f"{x:.0f} s")


def stall_split(rec: dict[str, Any]) -> str:
    """The longest stall's window split as the kernel counted the loop's thread (looplag.py)."""
    lags = rec["loop_lag_max_s"]
    split = (rec.get("loop_lag_split") or [None] * len(lags))[lags.index(max(x for x in lags if x is not None))]
    if not split:
        return ""
    return (f" (of {1000 * split['window_s']:.0f} ms: ran {1000 * split['on_cpu_s']:.0f}, waited for a core "
            f"{1000 * split['waiting_for_cpu_s']:.0f}, off a core {1000 * split['off_cpu_s']:.0f}"
            + (f"; the hypervisor took {1000 * split['stolen_s']:.0f} of the machine's cores"
               if split.get("stolen_s") else "") + ")")


def window_stalls(rec: dict[str, Any]) -> str:
    """The measured window's stalls over 100 ms (and 250 ms), all nodes, of their probes."""
    if "window_stalls" not in rec:
        return ""
    over = [sum(int(w[k]) for w in rec["window_stalls"]) for k in (">0.1", ">0.25")]
    return f"; in the window {over[0]} over 100 ms, {over[1]} over 250 ms, of {int(sum(rec['window_probes']))} probes"


def row(rec: dict[str, Any]) -> list[str]:
    mb = rec["dense_bytes"] / 1e6
    rate = rec.get("raw_rate")
    nominal = RATES.get(rec["link"])
    cells = [f"{rec['size']} ({rec['params'] / 1e6:.0f}M, {mb:.0f} MB)", rec["link"], str(rec["nodes"]),
             f"{rate * 8 / 1e9:.2f} Gbit/s" if rate else "-"]
    if "exchanges_per_min" not in rec:
        return cells + [rec.get("failed", "-")] + ["-"] * 10
    per_min = [x for x in rec["exchanges_per_min"] if x is not None]
    cells.append(f"{min(per_min):.1f} / {statistics.median(per_min):.1f}" if per_min else "-")
    cells.append(f"{max(rec['longest_gap_s']):.0f} s")
    goodputs = [d["bytes"] / d["seconds"] for d in rec.get("delta_fetches", []) if d.get("status") == 200]
    sizes = [d["bytes"] for d in rec.get("delta_fetches", []) if d.get("status") == 200]
    cells.append(f"{100 * statistics.median(goodputs) / rate:.0f} % ({statistics.median(sizes) / 1e6:.1f} MB)"
                 if goodputs and rate else "-")
    link_rate = rate if rate else None

    def snap_cell(snap: dict[str, Any]) -> str:
        return (f"{snap['seconds']:.2f} s = {snap['seconds'] / (snap['bytes'] / link_rate):.2f}x"
                if snap.get("status") == 200 and link_rate else str(snap.get("status", snap.get("failed", "-"))))
    late = rec.get("snapshot_fetch_settled")
    cells.append(snap_cell(rec.get("snapshot_fetch", {})) + (f"; settled {snap_cell(late)}" if late is not None else ""))
    peaks = [sum(p.values()) for p in rec["peak_rss"]]
    top = rec["peak_rss"][peaks.index(max(peaks))]
    split = " + ".join(f"{k} {v / 1e9:.2f}" for k, v in sorted(top.items()))  # daemon, worker
    sampled = ""
    if rec.get("sampled_rss"):  # the two processes sampled together (benchlib.nodeprobe.RssSampler)
        total, anon, file = max(rec["sampled_rss"])
        sampled = (f"; sampled together {total / 1e9:.2f} GB = {total / rec['dense_bytes']:.1f}x"
                   f" (anonymous {anon / 1e9:.2f} + file {file / 1e9:.2f})")
    cells.append(f"{max(peaks) / 1e9:.2f} GB = {max(peaks) / rec['dense_bytes']:.1f}x ({split}){sampled}")
    lags = [x for x in rec["loop_lag_max_s"] if x is not None]
    cells.append((f"{1000 * max(lags):.0f} ms{stall_split(rec)}" if lags else "-") + window_stalls(rec))
    cells.append(f"{sum(rec['suspicions']):.0f}")
    writes = [x for xs in rec.get("checkpoint_write_s", []) for x in xs]
    cells.append(f"{statistics.median(writes):.2f} s" if writes else "-")
    loads = rec.get("checkpoint_load_s") or []
    cells.append(f"{fmt_s(rec.get('resume_s'))} ({loads[-1]:.2f} s load)" if loads and "resume_s" in rec
                 else fmt_s(rec.get("resume_s")))
    boots = [b for b in rec.get("bootstrap", [])[1:] if b]
    states = sorted({str(b.get("state")) for b in boots})
    settled = f", settled {fmt_s(rec['others_bootstrapped_s'])}" if "others_bootstrapped_s" in rec else ""
    cells.append(f"{'/'.join(states) or '-'}, all training {fmt_s(rec.get('others_training_s'))}{settled}")
    ar = rec.get("allreduce", {})
    cells.append(f"{statistics.median(ar['seconds']):.2f} s" if ar.get("seconds") else str(ar.get("failed", "-"))[:40])
    del nominal
    return cells


HEADER = ["model", "link", "nodes", "raw link rate", "exchanges / node / min (min / median)",
          "longest gap without an exchange", "delta fetch: goodput / raw rate (size)",
          "snapshot fetch: seconds = x size / raw rate (after the bootstraps; settled: after the window)", "peak RSS / node = x float32 model",
          "longest loop stall (since start)", "suspicions", "checkpoint write (median)", "resume: worker running (load)",
          "the others' start from node 0 (bootstrap)", "DDP all-reduce (gloo) / round"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--links", nargs="+", default=list(RATES), choices=list(RATES))
    ap.add_argument("--nodes", type=int, default=4, help="nodes for sizes up to 124M")
    ap.add_argument("--big-nodes", type=int, default=2, help="nodes for 350M")
    ap.add_argument("--window", type=float, default=60.0, help="seconds of training measured per case")
    ap.add_argument("--rounds", type=int, default=3, help="all-reduce rounds timed (after one warm-up)")
    ap.add_argument("--min-free-gb", type=float, default=2.5)
    ap.add_argument("--resume-wait", type=float, default=300.0, help="seconds a resumed node has to exchange again")
    ap.add_argument("--skip-ddp", action="store_true")
    ap.add_argument("--keep-state", action="store_true",
                    help="keep each case's node state folders (checkpoints, replicas; removed by default, the logs kept): "
                         "three 124M cases on 4 nodes left 36 GB and filled the disk")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--workdir", default=str(ROOT / "run" / "bench_model_size"))
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    shaped = [link for link in args.links if link != "loopback"]
    if shaped and (reason := unavailable()):
        print(f"bench_model_size.py: {reason} (needed for {shaped})", file=sys.stderr)
        return 2
    extra = [a for kv in args.set for a in ("--set", kv)]
    recs: list[dict[str, Any]] = []
    for link in args.links:
        topo = Topology(max(args.nodes, args.big_nodes), tag="p2pms", subnet="10.78.0").up() if link != "loopback" \
            else None
        try:
            if topo is not None:
                topo.set_rate(link)
            place: Place = topo.place if topo is not None else loopback
            env = {"GLOO_SOCKET_IFNAME": "eth0"} if topo is not None else {"GLOO_SOCKET_IFNAME": "lo"}
            for size in args.sizes:
                n = args.big_nodes if SIZES[size] > 200_000_000 else args.nodes
                print(f"== {size} on {link}, {n} nodes", flush=True)
                rec = run_case(size, link, place, n, args.window, Path(args.workdir), 7811, int(args.min_free_gb * 1e9),
                               extra, args.resume_wait, args.keep_state)
                if not args.skip_ddp:
                    ddp_anchor(rec, place, n, args.rounds if link != "100mbit" or SIZES[size] < 100e6 else 1, env)
                recs.append(rec)
                append_jsonl(args.jsonl, {"bench": "model_size", **rec})
                print(table(HEADER, [row(rec)]), flush=True)
        finally:
            if topo is not None:
                topo.down()
    text = table(HEADER, [row(r) for r in recs])
    print(text)
    if args.write:
        write_section(f"{SECTION}\n\n```\nsudo nice -n 5 {command_line()}\n```\n\n- {machine()}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
