"""A byte-level causal transformer on a text file: an example p2pnode task (docs/TASKS.md).

Registered under the entry-point group ``p2pnode.tasks`` as ``charlm`` (pyproject.toml), so a
node names it ``training.task = "charlm"`` once this package is installed. The training items
are windows of ``context + 1`` bytes of the file's first part, read from a memory map as the
worker's DataLoader draws them; evaluation is on the last ``held_out`` share: the mean loss per
byte, its perplexity (``exp(loss)``) and next-byte accuracy. No labels: partitions other than
``iid`` are refused by the worker.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from p2pnode.tasks import TaskContext, TaskError

VOCAB = 256  # bytes: every node builds the same model, whatever its text holds


class Windows(Dataset[torch.Tensor]):
    """Windows of ``length`` bytes starting every ``stride`` bytes of ``data[start:stop]``."""

    def __init__(self, data: np.ndarray, start: int, stop: int, length: int, stride: int) -> None:
        self.data, self.start, self.length, self.stride = data, start, length, stride
        self.count = max(0, (stop - start - length) // stride + 1)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        at = self.start + i * self.stride
        return torch.from_numpy(np.array(self.data[at:at + self.length], dtype=np.int64))


class TinyGPT(nn.Module):
    """Token and position embeddings, pre-norm causal self-attention blocks, an output layer
    tied to the token embedding (a tied weight: p2pnode sends it once)."""

    def __init__(self, context: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Parameter(torch.zeros(context, dim))
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.position, std=0.02)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        h = self.blocks(self.embed(tokens) + self.position[:n], mask=mask, is_causal=True)
        return self.head(self.norm(h))


class CharLM:
    """The task: model, data, loss and metrics of a byte-level language model."""

    name = "charlm"
    eval_batch_size = 64

    def __init__(self, ctx: TaskContext) -> None:
        text = ctx.setting("text", "")
        self.context = ctx.setting("context", 64)
        self.dim, self.layers, self.heads = ctx.setting("dim", 64), ctx.setting("layers", 2), ctx.setting("heads", 4)
        held_out = ctx.setting("held_out", 0.1)
        if ctx.setting("optimizer", "node") == "adamw":  # else the node's (training.optimizer)
            self.optimizer = lambda model, lr: torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        if not text:
            raise TaskError("task.text is required: the text file to learn")
        if not Path(text).is_file():
            raise TaskError(f"task.text: {text} is not a file")
        if not 0 < held_out < 1 or self.context < 2 or self.dim % self.heads:
            raise TaskError("task.held_out must be in (0, 1), task.context >= 2, task.dim a multiple of task.heads")
        data = np.memmap(text, dtype=np.uint8, mode="r") if Path(text).stat().st_size else np.zeros(0, np.uint8)
        split = int(len(data) * (1 - held_out))
        length = self.context + 1
        # training windows overlap (a new one every quarter context); held-out ones do not
        self.train = Windows(data, 0, split, length, max(1, self.context // 4))
        self.test = Windows(data, split, len(data), length, self.context)

    def build_model(self) -> nn.Module:
        return TinyGPT(self.context, self.dim, self.layers, self.heads)

    def train_data(self) -> Windows:
        return self.train

    def test_data(self) -> Windows:
        return self.test

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        logits = model(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> dict[str, float]:
        total, right, loss = 0, 0, 0.0
        for batch in batches:
            logits = model(batch[:, :-1]).reshape(-1, VOCAB)
            target = batch[:, 1:].reshape(-1)
            loss += float(F.cross_entropy(logits, target, reduction="sum"))
            right += int((logits.argmax(1) == target).sum())
            total += int(target.numel())
        mean = loss / max(1, total)
        return {"loss": mean, "perplexity": math.exp(min(mean, 50.0)), "accuracy": right / max(1, total)}


def task(ctx: TaskContext) -> CharLM:
    """The factory the entry point names."""
    return CharLM(ctx)
