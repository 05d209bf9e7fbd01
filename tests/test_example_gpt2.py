"""The GPT-2-shaped example task (examples/gpt2) at a toy size: the tokenizer spells what it
does not know as bytes, the same text gives every node the same vocabulary, AdamW comes from
the task's hook, and a few steps lower the loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

gpt2 = pytest.importorskip("p2pnode_gpt2")


class Ctx:
    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def setting(self, key: str, default: Any) -> Any:
        return self.settings.get(key, default)


def small(tmp_path: Path, **extra: Any) -> Any:
    text = tmp_path / "text.txt"
    text.write_text("def add(a, b):\n    return a + b\n\n" * 200 + "class Thing:\n    pass\n" * 100)
    return gpt2.task(Ctx(**{"text": str(text), "vocab": 300, "context": 16, "dim": 32, "layers": 2, "heads": 4,
                            **extra}))


def test_tokenizer_spells_unknown_pieces_as_bytes() -> None:
    tok = gpt2.Tokenizer("return return return x", 258)
    ids = tok.encode("return zzz")
    assert ids[0] == 256  # the most frequent multi-byte piece
    assert list(ids[1:]) == list(b" zzz")  # a space is one byte; "zzz" is not in the vocabulary


def test_same_text_same_vocabulary_and_the_loss_falls(tmp_path: Path) -> None:
    a, b = small(tmp_path), small(tmp_path)
    assert a.tokenizer.ids == b.tokenizer.ids
    torch.manual_seed(0)
    model = a.build_model()
    opt = a.optimizer(model, 3e-3)
    assert isinstance(opt, torch.optim.AdamW)
    assert {g["weight_decay"] for g in opt.param_groups} == {0.1, 0.0}
    batch = torch.stack([a.train_data()[i] for i in range(8)])
    first = float(a.loss(model, batch))
    for _ in range(20):
        opt.zero_grad()
        a.loss(model, batch).backward()
        opt.step()
    assert float(a.loss(model, batch)) < 0.7 * first
    metrics = a.evaluate(model.eval(), [torch.stack([a.test_data()[0]])])
    assert set(metrics) == {"loss", "perplexity", "accuracy"}


def test_default_shape_is_gpt2_small() -> None:
    model = gpt2.GPT(32768, 128, 768, 12, 12)
    n = sum(p.numel() for p in model.parameters())  # the tied output layer counted once
    assert 110_000_000 < n < 111_000_000


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="multiple of task.heads"):
        small(tmp_path, dim=30)
