"""How far a node's public copy lags its model under the default publish (top-k 10 %, int8,
every 4 steps): ||x - x_hat|| / ||x|| after each publish, one node training alone, for the
built-in CNN (a quarter of Fashion-MNIST, its defaults) and for ShuffleNet v2 x0.5 on the
image folders of scripts/bench_batchnorm.py (a third of them, lr 0.03, cosine).

Why: gossip averages a node's model with a peer's public copy, and what the sparse publish has
not sent yet pulls the average back. bench_batchnorm found a cluster learning ShuffleNet far
slower than one machine under sparse copies and nearly as fast under dense ones; this says how
large that lag is for each model, in the same units.

    .venv/bin/python scripts/archive/study_lag.py cnn|shufflenet
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for bench_batchnorm
import bench_batchnorm  # noqa: E402  its ShuffleNet settings, so that the lag is that of the bench's nodes
from benchlib.testdata import write_image_folders
from p2pnode.compression.registry import build_sparsifier
from p2pnode.config import Config
from p2pnode.config.load import set_option
from p2pnode.wire.payload import ModelSpec
from p2pnode.worker.public import DeltaPublisher, floating_state
from p2pnode.worker.training import ShardTrainer


def config(model: str) -> Config:
    if model == "cnn":
        return Config.from_dict({"training": {"device": "cpu", "max_samples": 64 * 300, "shard": "0/4"}})
    root = Path(tempfile.mkdtemp(prefix="study-lag-")) / "photos"
    write_image_folders(root, 90, 30)
    cfg = Config.from_dict({"training": {"shard": "0/3"}})
    for option in bench_batchnorm.common(root):
        set_option(cfg, *option.split("=", 1))
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=("cnn", "shufflenet"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    trainer = ShardTrainer(config(args.model))
    spec = ModelSpec.from_state_dict(floating_state(trainer.model), "study")
    public = DeltaPublisher(trainer.model, spec, build_sparsifier("topk:density=0.1"), "node", "epoch", 0, "int8")
    lags = []
    while not trainer.done:
        trainer.train_step()
        if trainer.step % 4 == 0:
            public.publish(trainer.step, 0.0)
            x = floating_state(trainer.model)
            gap = sum(float(((x[k].reshape(-1) - public.xhat[k]) ** 2).sum()) for k in x)
            lags.append(math.sqrt(gap / sum(float((x[k] ** 2).sum()) for k in x)))
    n = len(lags)
    for share in (0.1, 0.25, 0.5, 0.75, 0.9):
        print(f"{args.model}: step {4 * (int(share * n) + 1)} of {trainer.step}: lag {lags[int(share * n)]:.3f}")
    print(f"{args.model}: largest {max(lags):.3f}, median {sorted(lags)[n // 2]:.3f}")


if __name__ == "__main__":
    main()
