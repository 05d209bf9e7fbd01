"""What each part of a node costs in memory, at one model size: measured in one process, part by
part, as the growth of its resident set (anonymous pages: what the kernel cannot take back; the
shared libraries' file pages are reported apart) and each step's peak (``VmHWM`` reset through
``/proc/self/clear_refs`` before it).

The parts are the real objects a node builds: the task's model (``benchlib.sizetask``, or the
GPT-2-shaped example with ``--task gpt2``), a backward pass (the gradient), the optimizer's
state after a step (SGD with momentum, or AdamW with ``--optimizer adamw``), the worker's public
copy x̂ (``DeltaPublisher``) and a publish, its version-0 copy kept for replicas (in memory, or in
a file: ``wire/replica.keep_genesis``), ``--replicas`` peers' replicas applied from snapshots (in
memory, or in files: ``ReplicaCache`` with a folder), a peer's snapshot as a big one arrives now
(spooled to a file by the daemon, net/spool.py, and applied from that file by the worker a
tensor at a time, wire/mapped.py), and the daemon's side of serving: for a big model
``ServedModel.attach`` to the worker's x̂ in its file (wire/public_file.py), a snapshot encoded
from it into a file of its own (wire/served_file.py) and streamed from there; for comparison the
mirror a small model's daemon keeps (``ServedModel.reset`` from a snapshot), which every model
had before. A part kept in a file mapping (the worker's x̂ of
a big model) counts its file pages: resident like the rest, though the kernel may write them out
and take them back. The daemon's and the worker's parts are added up as a node would hold them
(two processes, each with its own interpreter; the daemon does not import torch).

    nice -n 5 .venv/bin/python scripts/bench_memory.py --params 124000000 [--write]
"""

from __future__ import annotations

import argparse
import functools
import gc
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib.results import add_output_args, command_line, machine, table, write_section  # noqa: E402

SECTION = "## Memory per node, part by part"


def rss() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
            out[key] = 1024 * int(line.split()[1])
    return out


def reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


class Meter:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int, int, int]] = []  # (process, part, kept anon, kept file, peak)

    def part(self, process: str, name: str, fn: Callable[[], Any]) -> Any:
        gc.collect()
        before = rss()
        reset_peak()
        began = time.perf_counter()
        out = fn()
        took = time.perf_counter() - began
        gc.collect()
        after = rss()
        kept = after["RssAnon"] - before["RssAnon"]
        mapped = max(0, after["RssFile"] - before["RssFile"])
        peak = max(0, after["VmHWM"] - before["VmRSS"])
        self.rows.append((process, name, kept, mapped, peak))
        print(f"{process:7s} {name:60s} kept {kept / 1e6:8.0f} MB + file {mapped / 1e6:6.0f} MB  "
              f"peak +{peak / 1e6:8.0f} MB  ({took:.1f} s)", flush=True)
        return out


def receive_spooled(body: bytes, folder: Path) -> Any:
    """``body`` through the daemon's spool as a fetch receives it: 64 KiB reads (what aiohttp
    hands over), each a new bytes object, written to a file in a thread (net/spool.py)."""
    import asyncio

    from p2pnode.net.spool import Spool

    async def run() -> Any:
        fill = Spool(folder, spool_from=1).fill(len(body))
        view = memoryview(body)
        for at in range(0, len(body), 1 << 16):
            await fill.add(bytes(view[at:at + (1 << 16)]))
        return await fill.finish()
    return asyncio.run(run())


def stream_out(parts: Any) -> None:
    """What ``PartsResponse`` does with a snapshot's parts, less the socket: each 1 MiB slice
    read (copied, as the socket's send copies it) and then released, where the parts say how."""
    release = getattr(parts, "release", None)
    for part in parts:
        view = memoryview(part).cast("B")
        for at in range(0, view.nbytes, 1 << 20):
            bytes(view[at:at + (1 << 20)])
            if release is not None:
                release(view[at:at + (1 << 20)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=int, default=124_000_000, help="benchlib.sizetask's task.params")
    ap.add_argument("--task", choices=["sizetask", "gpt2"], default="sizetask")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--replicas", type=int, default=3, help="peers' replicas held (a 4-node cluster: 3)")
    ap.add_argument("--whole-copies", action="store_true",
                    help="also a publish of every entry in int8, what gossip publishes for an adaptive optimizer")
    ap.add_argument("--whole-publish", action="store_true",
                    help="also a whole publish (every entry, float32: what a node sends once after its bootstrap)")
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    from p2pnode.malloc import return_big_frees

    return_big_frees()  # as the daemon and the worker do (p2pnode/malloc.py)
    m = Meter()
    base = rss()
    torch = m.part("worker", "import torch (and p2pnode's worker modules)", lambda: __import__("torch"))
    torch.set_num_threads(1)
    torch_file = rss()["RssFile"] - base["RssFile"]
    from p2pnode.compression.registry import build_sparsifier
    from p2pnode.config.adaptive_gossip import WHOLE
    from p2pnode.wire.codec import encode
    from p2pnode.wire.mapped import peer_body
    from p2pnode.wire.payload import ModelSpec, Snapshot
    from p2pnode.wire.public_file import PublicReader
    from p2pnode.wire.replica import ReplicaCache, keep_genesis
    from p2pnode.wire.served import ServedModel
    from p2pnode.worker.public import DeltaPublisher, floating_state

    torch.manual_seed(0)
    if args.task == "gpt2":
        from p2pnode_gpt2 import GPT
        model = m.part("worker", "model (GPT-2 shape, 50257 tokens)", lambda: GPT(50257, 1024, 768, 12, 12))
        x = torch.randint(0, 50257, (1, 65))

        def loss() -> Any:
            return torch.nn.functional.cross_entropy(model(x[:, :-1]).reshape(-1, 50257), x[:, 1:].reshape(-1))
    else:
        from benchlib.sizetask import SideBySide, shape_for
        width, layers = shape_for(args.params)
        model = m.part("worker", f"model ({layers} x {width}² float32)", lambda: SideBySide(width, layers))
        x = torch.randn(1, width)

        def loss() -> Any:
            return (model(x) ** 2).mean()
    params = sum(p.numel() for p in model.parameters())
    dense = 4 * params
    m.part("worker", "gradient (a backward pass)", lambda: loss().backward())
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-4) if args.optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9))
    m.part("worker", f"optimizer state ({'AdamW: two moments' if args.optimizer == 'adamw' else 'SGD momentum'})",
           opt.step)
    spec = ModelSpec.from_state_dict(floating_state(model), "fp-memory")
    tmp = Path(tempfile.mkdtemp(prefix="p2p-mem-"))
    where = "in a file mapped by the worker" if dense >= 64 * 1024 * 1024 else "in memory (under 64 MiB)"
    pub = m.part("worker", f"public copy x̂ (DeltaPublisher), {where}", lambda: DeltaPublisher(
        model, spec, build_sparsifier("topk:density=0.1"), "me", secrets.token_hex(6), 0, "int8", tmp))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=1e-3)
    published = m.part("worker", "a publish (top-10 %, int8: transient)", lambda: pub.publish(1, 1.0))
    if args.whole_copies:  # an adaptive optimizer's gossip publishes every entry (config/adaptive_gossip.py)
        copies = m.part("worker", f"public copy x̂ for whole copies ({WHOLE}), {where}", lambda: DeltaPublisher(
            model, spec, build_sparsifier(WHOLE), "me", secrets.token_hex(6), 0, "int8", tmp / "whole"))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p), alpha=1e-3)  # every entry moves, as AdamW moves them
        m.part("worker", f"a publish of every entry ({WHOLE}, int8: an adaptive optimizer's gossip, transient)",
               lambda: copies.publish(1, 1.0))
        copies.let_go()
        del copies
    if args.whole_publish:  # what a node publishes once after adopting a peer's model (its bootstrap)
        whole = DeltaPublisher(model, spec, build_sparsifier("topk:density=0.1"), "me", secrets.token_hex(6), 0,
                               "int8")  # in memory: the file's pages would be counted here too
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.rand_like(p) + 0.5)  # every entry moves, as after an adoption
        m.part("worker", "a whole publish (after adopting a peer's model: transient)",
               lambda: whole.publish(2, 1.0, full=True))
        del whole
    big = "" if dense >= 64 * 1024 * 1024 else " (below the threshold: memory)"
    def keep() -> object:  # as the worker does (worker/main.py): x̂'s pages let go once it was read
        kept = keep_genesis(tmp, spec, pub.xhat)
        pub.let_go()
        return kept
    genesis = m.part("worker", f"version-0 copy for replicas, in a file{big}", keep)
    snap = encode(Snapshot(spec.header("snapshot", "peer", "e", 1), {k: v.numpy() for k, v in pub.xhat.items()}))
    m.rows.append(("worker", "(a peer's snapshot as received: the pipe's body, before it was spooled)", len(snap), 0,
                   len(snap)))
    spooled = m.part("daemon", "a peer's snapshot received into a spool file (net/spool.py: transient)",
                     functools.partial(receive_spooled, snap, tmp / "spool"))
    caches = {"memory": ReplicaCache(args.replicas + 1)}
    disk_cache = ReplicaCache(args.replicas + 1, tmp / "replicas")

    def fill(cache: ReplicaCache) -> None:
        for i in range(args.replicas):
            body = encode(Snapshot(spec.header("snapshot", f"peer{i}", "e", 1),
                                   {k: v.numpy() for k, v in pub.xhat.items()}))
            cache.apply(f"peer{i}", body, spec, max_bytes=len(body))
            del body
    m.part("worker", f"{args.replicas} replicas in memory", lambda: fill(caches["memory"]))
    caches.clear()  # dropped: the next part is measured without them
    gc.collect()
    m.part("worker", f"{args.replicas} replicas in files", lambda: fill(disk_cache))

    def from_spool() -> None:  # what the worker does with a PeerPayload naming the spooled file
        with peer_body(b"", str(spooled.path)) as (data, release):
            disk_cache.apply("peer", data, spec, max_bytes=len(spooled), release=release)
    m.part("worker", "a spooled snapshot applied from its file to a replica's file (transient)", from_spool)
    spooled.close()
    from p2pnode.worker.averaging import average_into, relative_distance

    # the publish above as a peer's delta: its replica made at x̂'s version 0 first (a snapshot
    # of it), then the delta, in memory as the pipe brings a body under 64 MiB
    base = encode(Snapshot(spec.header("snapshot", "me", pub.epoch, 0), {k: np.asarray(v) for k, v in genesis.items()}))
    disk_cache.apply("me", base, spec, max_bytes=len(base))
    del base
    m.part("worker", f"a peer's delta ({len(published) / 1e6:.0f} MB, top-10 %, int8, in memory) applied to its "
           "replica's file (transient)", lambda: disk_cache.apply("me", published, spec, max_bytes=len(published)))
    replica = disk_cache.get("me")
    assert replica is not None
    m.part("worker", "the distance to a replica (robust averaging's check: transient)",
           lambda: relative_distance(model, replica.tensors))
    m.part("worker", "averaging in a replica from its file (transient)", lambda: average_into(model, replica.tensors, 0.5))
    del snap
    if pub.file is not None:
        attached = ServedModel(spec, "me", pub.epoch)
        m.part("daemon", "served x̂: the worker's file (ServedModel.attach, no copy)", lambda: attached.attach(
            PublicReader(pub.file.path), pub.epoch, 0))
        attached.publish(published)
        held = m.part("daemon", "a snapshot encoded from the file into a file of its own (wire/served_file.py)",
                      lambda: attached.serve(None, None))
        assert held.kind == "snapshot" and held.version == 1 and held.snapshot is not None
        m.part("daemon", "that snapshot streamed: 1 MiB slices read, each let go once sent (net/stream.py)",
               functools.partial(stream_out, held.snapshot.parts))
        del held, attached
    served = ServedModel(spec, "me", "e")
    m.part("daemon", "served mirror x̂ (ServedModel.reset from a snapshot: models under 64 MiB; before, all)",
           lambda: served.reset(Snapshot(spec.header("snapshot", "me", "e", 0),
                                         {k: v.numpy() for k, v in pub.xhat.items()})))
    del genesis
    mb = 1e6
    rows = [[proc, part, f"{kept / mb:.0f} MB", f"{mapped / mb:.0f} MB", f"{(kept + mapped) / dense:.2f}x",
             f"{peak / mb:.0f} MB"] for proc, part, kept, mapped, peak in m.rows]
    text = table(["process", "part", "kept (anonymous)", "kept (file pages)", "x float32 model", "peak while made"],
                 rows, "llllrr")
    note = (f"Model: {params / 1e6:.1f}M parameters, {dense / mb:.0f} MB float32. torch's shared libraries add "
            f"{torch_file / mb:.0f} MB of file pages to each process that imports it (shared between "
            f"processes, counted in each one's RSS).")
    print(text)
    print(note)
    if args.write:
        write_section(f"{SECTION}\n\n```\nnice -n 5 {command_line()}\n```\n\n- {machine()}\n\n{note}\n\n{text}\n")
    shutil.rmtree(tmp, ignore_errors=True)  # the public copy's, replicas' and spool's folders
    return 0


if __name__ == "__main__":
    sys.exit(main())
