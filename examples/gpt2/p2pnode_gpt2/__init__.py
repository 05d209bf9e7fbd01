"""A GPT-2-small-shaped causal transformer on offline text: an example p2pnode task of about
110M parameters (docs/TASKS.md).

Registered under the entry-point group ``p2pnode.tasks`` as ``gpt2`` (pyproject.toml). The
model has GPT-2 small's shape: 12 pre-norm blocks of width 768 with 12 heads and a 4x MLP
(GELU), learned positions, the output layer tied to the token embedding; its vocabulary is
this package's own (below), 32768 tokens by default, so it has about 110M parameters (GPT-2's
50257 tokens give 124M). It trains with AdamW through the task's optimizer hook.

The text ships with Python: the sources of the standard library's top-level modules, in name
order, up to ``text_mb`` megabytes (or any file named by ``task.text``). Nothing is downloaded.
The tokenizer is built from that text at start, the same on every node: the 256 byte values,
then the most frequent words, numbers, single punctuation marks and runs of white space (ties
in first-seen order); a piece outside the vocabulary is spelled out as its UTF-8 bytes. The
training items are windows of ``context + 1`` tokens from the first part of the text; the last
``held_out`` share is for evaluation (loss per token, perplexity, next-token accuracy). No
labels: partitions other than ``iid`` are refused by the worker.
"""

from __future__ import annotations

import math
import re
import sysconfig
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from p2pnode.tasks import TaskContext, TaskError

PIECE = re.compile(r"\w+|[^\w\s]|\s+")


def stdlib_text(megabytes: float) -> str:
    """The standard library's top-level module sources, in name order, up to ``megabytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    size, limit = 0, int(megabytes * 1e6)
    for path in sorted(root.glob("*.py")):
        if size >= limit:
            break
        text = path.read_text(encoding="utf-8", errors="replace")[:limit - size]
        out.append(text)
        size += len(text)
    if not out:
        raise TaskError(f"no Python sources under {root}: name a text file with task.text")
    return "".join(out)


class Tokenizer:
    """Bytes plus the text's most frequent pieces; a piece outside the vocabulary as bytes."""

    def __init__(self, text: str, vocab: int) -> None:
        counts = Counter(PIECE.findall(text))
        multi = [p for p, _ in counts.most_common() if len(p.encode()) > 1]
        self.ids = {p: 256 + i for i, p in enumerate(multi[:vocab - 256])}
        self.vocab = vocab

    def encode(self, text: str) -> np.ndarray:
        out: list[int] = []
        for piece in PIECE.findall(text):
            i = self.ids.get(piece)
            if i is None:
                out.extend(piece.encode())
            else:
                out.append(i)
        return np.asarray(out, dtype=np.int32)


class Windows(Dataset[torch.Tensor]):
    """Windows of ``length`` tokens every ``stride`` tokens of ``tokens``."""

    def __init__(self, tokens: np.ndarray, length: int, stride: int) -> None:
        self.tokens, self.length, self.stride = tokens, length, stride
        self.count = max(0, (len(tokens) - length) // stride + 1)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        at = i * self.stride
        return torch.from_numpy(self.tokens[at:at + self.length].astype(np.int64))


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, as GPT-2's."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(context, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: p2pnode sends it once
        for name, p in self.named_parameters():
            if p.dim() >= 2:  # GPT-2's initialisation; residual projections scaled by depth
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class Gpt2Task:
    """The task: model, data, loss, metrics and AdamW."""

    name = "gpt2"
    eval_batch_size = 4

    def __init__(self, ctx: TaskContext) -> None:
        self.vocab = ctx.setting("vocab", 32768)
        self.context = ctx.setting("context", 128)
        self.dim, self.layers, self.heads = ctx.setting("dim", 768), ctx.setting("layers", 12), ctx.setting("heads", 12)
        held_out = ctx.setting("held_out", 0.05)
        text_file = ctx.setting("text", "")
        megabytes = ctx.setting("text_mb", 4.0)
        test_windows = ctx.setting("test_windows", 64)  # a node evaluates the whole test set at the end
        self.weight_decay = ctx.setting("weight_decay", 0.1)
        if self.vocab < 257 or self.context < 2 or self.dim % self.heads or not 0 < held_out < 1:
            raise TaskError("task.vocab must be > 256, task.context >= 2, task.dim a multiple of task.heads, "
                            "task.held_out in (0, 1)")
        if text_file and not Path(text_file).is_file():
            raise TaskError(f"task.text: {text_file} is not a file")
        text = Path(text_file).read_text(encoding="utf-8", errors="replace") if text_file else stdlib_text(megabytes)
        self.tokenizer = Tokenizer(text, self.vocab)
        tokens = self.tokenizer.encode(text)
        split = int(len(tokens) * (1 - held_out))
        length = self.context + 1
        self.train = Windows(tokens[:split], length, max(1, self.context // 2))
        self.test = Windows(tokens[split:], length, self.context)
        self.test.count = min(self.test.count, max(1, test_windows))
        if not len(self.train) or not len(self.test):
            raise TaskError("the text is too short for task.context")

    def build_model(self) -> nn.Module:
        return GPT(self.vocab, self.context, self.dim, self.layers, self.heads)

    def optimizer(self, model: nn.Module, lr: float) -> torch.optim.Optimizer:
        """AdamW, GPT-2's way: weight decay on matrices only, betas (0.9, 0.95)."""
        decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
        rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": self.weight_decay},
                                  {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))

    def train_data(self) -> Windows:
        return self.train

    def test_data(self) -> Windows:
        return self.test

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        logits = model(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.vocab), batch[:, 1:].reshape(-1))

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> dict[str, float]:
        total, right, loss = 0, 0, 0.0
        for batch in batches:
            logits = model(batch[:, :-1]).reshape(-1, self.vocab)
            target = batch[:, 1:].reshape(-1)
            loss += float(F.cross_entropy(logits, target, reduction="sum"))
            right += int((logits.argmax(1) == target).sum())
            total += int(target.numel())
        mean = loss / max(1, total)
        return {"loss": mean, "perplexity": math.exp(min(mean, 50.0)), "accuracy": right / max(1, total)}


def task(ctx: TaskContext) -> Gpt2Task:
    """The factory the entry point names."""
    return Gpt2Task(ctx)
