"""A checkpoint that cannot be loaded is set aside with one log line and the node starts
without it: torn bytes, a foreign pickle that would run code (refused by weights_only, never
executed), a tensors-only file that is not a p2pnode checkpoint. The line never carries
torch's advice to load with weights_only=False. Real files, real torch.load."""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import pytest
import torch

from p2pnode import checkpoint


class Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/p2pnode-checkpoint-pwned",))


def torn(path: Path) -> None:
    checkpoint.save(path, {"model": {"w": torch.zeros(3)}, "step": 1})
    path.write_bytes(path.read_bytes()[:40])


def evil(path: Path) -> None:
    path.write_bytes(pickle.dumps({"model": Evil()}))


def foreign(path: Path) -> None:
    torch.save({"weights": torch.ones(2)}, path)


@pytest.mark.parametrize("make", [torn, evil, foreign, lambda p: p.write_bytes(b"")])
def test_unloadable_checkpoint_is_set_aside_with_one_line(tmp_path: Path, make, caplog) -> None:
    path = tmp_path / checkpoint.CHECKPOINT_NAME
    make(path)
    before = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="p2pnode.checkpoint"):
        assert checkpoint.load(path) is None
    assert not path.exists()
    (aside,) = tmp_path.glob("checkpoint.pt.invalid-*")
    assert aside.read_bytes() == before  # kept for a post-mortem, never over an earlier one
    (record,) = caplog.records
    msg = record.getMessage()
    assert "\n" not in msg and "weights_only" not in msg and aside.name in msg, msg
    assert not Path("/tmp/p2pnode-checkpoint-pwned").exists()

    make(path)  # a second bad file in the same second gets its own name
    assert checkpoint.load(path) is None and len(list(tmp_path.glob("checkpoint.pt.invalid-*"))) == 2


def test_a_good_checkpoint_loads(tmp_path: Path) -> None:
    path = tmp_path / checkpoint.CHECKPOINT_NAME
    checkpoint.save(path, {"model": {"w": torch.arange(3.0)}, "step": 7})
    state = checkpoint.load(path)
    assert state is not None and state["step"] == 7 and torch.equal(state["model"]["w"], torch.arange(3.0))
