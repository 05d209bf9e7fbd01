"""A torch-free stand-in for the training worker (``training.worker = "stub"``).

For tests that need real nodes but no learning (membership, auth, TLS, lifecycle): it starts
in a fraction of a second and idles between steps instead of filling a core. Everything the
daemon sees is real: the same pipe protocol, a real public model (two small float32 tensors)
published as sparse deltas through the real codec, peers' payloads applied to real replicas
and averaged in, checkpoints written atomically and resumed after a restart. What is not real
is the training: a step moves the model a little towards this shard's fixed target, the loss is
the squared distance to it, and "accuracy" is 1 / (1 + loss). It always averages by the mean,
under the same robust rule as the torch worker (``exchange.robust``, p2pnode/worker/robust.py):
a peer's model is clipped to the radius, or refused as an outlier beyond it.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from p2pnode.checkpoint import write_parts
from p2pnode.config import Config, merge, parse_shard
from p2pnode.pipe_protocol import ADOPT, FETCH_FALLBACK, Applied, Evaluated, Hello, PeerPayload, Progress, Published
from p2pnode.pipe_protocol import mean_weight
from p2pnode.wire.payload import (
    ArchitectureMismatch,
    Delta,
    ModelSpec,
    NonFiniteError,
    PayloadError,
    Snapshot,
    TensorSpec,
)
from p2pnode.wire.codec import encode as encode_payload
from p2pnode.wire.codec import payload_limit
from p2pnode.wire.genesis import digest
from p2pnode.wire.mapped import peer_body
from p2pnode.wire.public_file import NAME as PUBLIC_FILE
from p2pnode.wire.public_file import PublicFile
from p2pnode.wire.replica import DISK_FROM, ReplicaCache, ReplicaGap, replica_folder
from p2pnode.worker.process import PeerLoop, run_spawned
from p2pnode.worker.robust import applied_clip, clip_payload, make_clipper, outlier_refusal

log = logging.getLogger("p2pnode.worker")

SPEC = ModelSpec("stub-1", [TensorSpec("layer.weight", (32, 16)), TensorSpec("layer.bias", (32,))])
CHECKPOINT_NAME = "checkpoint.stub"
STEP_SECONDS = 0.02  # idle between steps: about 50 steps a second, next to no CPU
RATE = 0.02  # how far one step moves towards the target
DENSITY = 0.25  # share of each tensor's entries one publish sends
SPREAD = 0.1  # how far one shard's target is from the common one (RMS per entry; the common one's is 1)
#: entries of each tensor one step moves (windows in turn): all of the small model's, a sliver
#: of a big one's, so that a step of a 100M-parameter stub costs a millisecond, not a second
WINDOW = 1 << 16
#: entries of each tensor the loss is measured on (all of the small model's)
LOSS_SAMPLE = 1 << 16


def stub_spec(params: int) -> ModelSpec:
    """The stub's model: its two small tensors, or ``params`` float32 parameters in four flat
    tensors (``training.stub_params``: a big model whose steps cost next to nothing)."""
    if params <= 0:
        return SPEC
    q = params // 4
    sizes = [q, q, q, params - 3 * q]
    return ModelSpec(f"stub-{params}", [TensorSpec(f"block{i}.weight", (n,)) for i, n in enumerate(sizes)])


class StubWorker(PeerLoop):
    def __init__(self, conn: Connection, cfg: Config, node_id: str) -> None:
        super().__init__(conn)
        self.cfg, self.node_id = cfg, node_id
        t = cfg.training
        shard, _ = parse_shard(t.shard)
        init, own = np.random.default_rng(t.seed), np.random.default_rng(t.seed * 1000 + shard + 1)
        common = np.random.default_rng(t.seed + 1_000_003)
        self.spec = spec = stub_spec(t.stub_params)
        # Same start on every node (as the real worker), a different target per shard, near a
        # common one (as the optima of one task's shards are): far-apart targets would keep
        # honest nodes further apart than robust averaging's radius (refused as outliers)
        if spec is SPEC:
            self.x = {s.name: (init.standard_normal(s.numel) * 0.1).astype(np.float32) for s in SPEC.tensors}
            self.target = {s.name: (common.standard_normal(s.numel) + SPREAD * own.standard_normal(s.numel))
                           .astype(np.float32) for s in SPEC.tensors}
        else:  # a block of draws tiled: a big model's start in a second, not a minute (values repeat)
            def tiled(gen: np.random.Generator, n: int, scale: float) -> np.ndarray:
                block = gen.standard_normal(min(n, 1 << 20), dtype=np.float32) * np.float32(scale)
                return np.resize(block, n)

            self.x = {s.name: tiled(init, s.numel, 0.1) for s in spec.tensors}
            self.target = {s.name: tiled(common, s.numel, 1.0) + tiled(own, s.numel, SPREAD) for s in spec.tensors}
        #: the windows (per tensor) moved since the last publish: only they can differ from x̂
        self.touched: dict[str, set[int]] = {s.name: set() for s in spec.tensors}
        self.step = self.samples = self.version = 0
        self.ckpt_path = Path(cfg.node.state_dir) / CHECKPOINT_NAME
        self.resumed = self._load()
        self.waiting = (cfg.training.min_peers > 0 or cfg.training.start_settle > 0) and not self.resumed
        self.published_step = self.step
        #: a big model's x̂ is a file the daemon reads to serve it (wire/public_file.py)
        self.public_file = (PublicFile(replica_folder(cfg.node.state_dir) / PUBLIC_FILE, spec, self.x, self.version)
                            if 4 * spec.numel >= DISK_FROM else None)
        self.xhat = (dict(self.public_file.arrays) if self.public_file is not None
                     else {k: v.copy() for k, v in self.x.items()})
        #: x̂ at version 0, a peer's replica's start when our first fetch named it (wire/genesis.py)
        self.genesis = {k: v.copy() for k, v in self.xhat.items()} if self.version == 0 else None
        self.epoch = secrets.token_hex(6)
        self.replicas = ReplicaCache(cfg.exchange.max_replicas)
        x = cfg.exchange
        self.clipper = make_clipper(x.robust, x.clip_factor, x.clip_max, x.clip_refuse)
        self.dirty = False

    # --- state ------------------------------------------------------------------------------

    def _load(self) -> bool:
        try:
            raw = self.ckpt_path.read_bytes()
        except FileNotFoundError:
            return False
        try:
            state = msgpack.unpackb(raw, raw=False)
            x = {s.name: np.frombuffer(state["x"][s.name], np.float32, count=s.numel).copy()
                 for s in self.spec.tensors}
            step, samples, version = int(state["step"]), int(state["samples"]), int(state["version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"checkpoint {self.ckpt_path} is not a stub worker checkpoint ({exc!r}); "
                             "move it away to start from scratch") from exc
        self.x, self.step, self.samples, self.version = x, step, samples, version
        return True

    def write_checkpoint(self) -> None:
        """One msgpack map, streamed: the tensors' bytes go to the file as they are (no copy of
        a big model in memory), atomically (checkpoint.write_parts)."""
        head = msgpack.packb({"step": self.step, "samples": self.samples, "version": self.version},
                             use_bin_type=True)
        parts: list[bytes | memoryview] = [bytes([0x84]), head[1:], msgpack.packb("x"),
                                           bytes([0xde]) + len(self.x).to_bytes(2, "big")]
        for name, x in self.x.items():
            parts += [msgpack.packb(name), bytes([0xc6]) + x.nbytes.to_bytes(4, "big"), x.data.cast("B")]
        write_parts(self.ckpt_path, parts)

    @property
    def loss(self) -> float:
        return float(np.mean([np.mean((self.x[k][:LOSS_SAMPLE] - self.target[k][:LOSS_SAMPLE]) ** 2)
                              for k in self.x]))

    @property
    def done(self) -> bool:
        limit = self.cfg.training.max_samples
        return bool(limit) and self.samples >= limit

    # --- messages ---------------------------------------------------------------------------

    def _payload(self, kind: str, base: int, entries: dict[str, tuple[np.ndarray, np.ndarray]] | None) -> bytes:
        header = self.spec.header(kind, self.node_id, self.epoch, self.version, base_version=base, step=self.step,
                             loss=self.loss)
        if entries is None:
            return encode_payload(Snapshot(header, self.xhat))  # encode copies the values out
        return encode_payload(Delta(header, entries))

    def hello(self) -> None:
        if self.public_file is None:
            snapshot, path, genesis = self._payload("snapshot", self.version, None), "", ""
        else:  # the daemon reads x̂ from the file
            self.public_file.end(self.version, self.step, self.loss)
            snapshot, path = b"", str(self.public_file.path)
            genesis = digest(self.xhat, self.spec) if self.version == 0 else ""
        self.send(Hello(fingerprint=self.spec.fingerprint, epoch=self.epoch, version=self.version, step=self.step,
                        samples=self.samples, snapshot=snapshot, public_file=path, genesis=genesis,
                        resumed=self.resumed, params=self.spec.numel))

    def publish(self, full: bool = False) -> None:
        """q = top-k of x - x_hat per tensor (every entry with ``full``: after an adoption);
        x_hat += q; send the encoded delta."""
        entries = {}
        for name, xhat in self.xhat.items():
            # top-k within each window moved since the last publish (the whole tensor of the
            # small model): elsewhere x̂ already equals x. After an adoption every entry, taken
            # in order: no selection (a sort of each window's every index took 3.8 s for 100M)
            windows = [] if full else sorted(self.touched[name])
            self.touched[name] = set()
            parts = [np.arange(xhat.size)] if full and xhat.size else []
            for w in windows:
                lo = w * WINDOW
                diff = self.x[name][lo:lo + WINDOW] - xhat[lo:lo + WINDOW]
                k = max(1, int(diff.size * DENSITY))
                parts.append(np.sort(np.argpartition(np.abs(diff), -k)[-k:]) + lo)
            if not parts:
                continue
            idx = np.concatenate(parts).astype(np.uint32)
            entries[name] = (idx, self.x[name][idx] - xhat[idx])
        if self.public_file is not None:  # x̂ changes only now: the daemon's reads retry over this span
            self.public_file.begin()
        for name, (idx, values) in entries.items():
            self.xhat[name][idx] += values
        self.version += 1
        if self.public_file is not None:
            self.public_file.end(self.version, self.step, self.loss)
        self.published_step = self.step
        self.send(Published(version=self.version, delta=self._payload("delta", self.version - 1, entries)))

    def on_peer(self, msg: PeerPayload) -> None:
        try:
            limit = payload_limit(self.spec, self.cfg.http.max_payload_bytes)
            with peer_body(msg.data, msg.path) as (data, release):  # a big body: from the daemon's file
                replica = self.replicas.apply(msg.peer, data, self.spec, limit,
                                              self.genesis if msg.genesis else None, release)
        except OSError as exc:  # the daemon's spooled file is gone (it gave up waiting): ours, not the peer's
            self.send(Applied(token=msg.token, ok=False, peer=msg.peer, reason="gap",
                              detail=f"spooled body unreadable: {exc}"[:300]))
            return
        except PayloadError as exc:
            reason = ("architecture" if isinstance(exc, ArchitectureMismatch) else
                      "non-finite" if isinstance(exc, NonFiniteError) else
                      "gap" if isinstance(exc, ReplicaGap) else "malformed")
            self.send(Applied(token=msg.token, ok=False, peer=msg.peer, reason=reason, detail=str(exc)[:300]))
            return
        weight = 1.0 if msg.mode == ADOPT else mean_weight(msg.nth)
        # ||x - x_hat_peer|| / ||x|| before averaging, as the torch worker reports it
        gap = math.sqrt(sum(float(np.sum((self.x[k] - replica.arrays[k]) ** 2)) for k in self.x))
        norm = math.sqrt(sum(float(np.sum(x ** 2)) for x in self.x.values()))
        distance = gap / norm if norm > 0 else -1.0
        clip = clip_payload(self.clipper, msg, distance, self.done)
        if clip is not None and clip.refused and self.clipper is not None:
            self.send(outlier_refusal(self.clipper, msg, clip, distance, replica.epoch or "", replica.version))
            return
        if clip is not None:  # averaging with weight w * min(1, tau / d), as the torch worker does
            weight *= clip.scale
        for name, x in self.x.items():
            x *= 1.0 - weight
            x += weight * replica.arrays[name]
            self.touched[name].update(range(-(-x.size // WINDOW)))  # all of x moved
        self.dirty = True
        if msg.mode == ADOPT:  # the whole adopted model published before the answer, as the torch worker does
            self.publish(full=True)
        self.send(Applied(token=msg.token, ok=True, peer=msg.peer, epoch=replica.epoch or "",
                          version=replica.version, weight=weight, distance=distance, **applied_clip(clip)))

    def checkpoint_step(self) -> int:
        return self.step

    def finished(self) -> bool:
        return self.done

    def evaluate_all(self, consensus: bool) -> None:
        self.evaluate(consensus=consensus)

    def publish_asked(self) -> None:
        self.publish()

    def evaluate(self, consensus: bool = False) -> None:
        loss = self.loss
        self.send(Evaluated(step=self.step, accuracy=1.0 / (1.0 + loss), loss=loss,
                            samples=self.cfg.training.eval_samples, consensus=consensus))

    def train_step(self) -> None:
        c = self.cfg
        for name, x in self.x.items():
            w = self.step % -(-x.size // WINDOW)  # the next window of this tensor
            window = x[w * WINDOW:(w + 1) * WINDOW]
            window += RATE * (self.target[name][w * WINDOW:(w + 1) * WINDOW] - window)
            self.touched[name].add(w)
        self.step += 1
        self.samples += c.training.batch_size
        if c.compression.publish_on == "steps":
            if self.step % c.compression.publish_every == 0:
                self.publish()
        elif self.done or self.step - self.published_step >= FETCH_FALLBACK * c.compression.publish_every:
            self.publish()  # publish_on = "fetch": the last steps, and a copy nobody fetched for long
        self.send(Progress(step=self.step, samples=self.samples, loss=self.loss, done=self.done, lr=c.training.lr))
        every = c.training.eval_every
        if (every and self.step % every == 0) or self.done:
            self.evaluate()

    def loop(self) -> None:
        next_step = time.monotonic()
        last_idle_publish = 0.0
        while self.running:
            # Between steps, take everything that arrives; block only until the next step is due.
            while self.running and self.conn.poll(max(0.0, next_step - time.monotonic())):
                self.handle(self.receive())
            if not self.running:
                break
            next_step = time.monotonic() + STEP_SECONDS
            if self.waiting or self.held():
                continue
            if not self.done:
                self.train_step()
            elif self.dirty and time.monotonic() - last_idle_publish > 1.0:
                last_idle_publish, self.dirty = time.monotonic(), False
                self.publish()


def run(conn: Connection, cfg_dict: dict[str, Any], node_id: str) -> None:
    """Entry point of the spawned process (p2pnode/worker/process.py)."""
    def make() -> StubWorker:
        cfg = Config()
        merge(cfg, cfg_dict)  # validated by the daemon already; validation would import torch
        logging.basicConfig(level=cfg.node.log_level.upper(),
                            format="%(asctime)s stub-worker %(levelname)s %(message)s")
        return StubWorker(conn, cfg, node_id)

    run_spawned(conn, make, (ValueError,))
