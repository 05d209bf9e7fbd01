"""Shared fixtures: real gradients of the small CNN (Fashion-MNIST, or synthetic if absent)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def cnn_grads() -> dict[str, torch.Tensor]:
    """Gradients of the 0.42 M-parameter CNN on one batch of 128 real images, after a few
    SGD steps so they are not the initialisation's."""
    from p2pnode.data import DataError, fashion_mnist, synthetic
    from p2pnode.models import build_model

    torch.manual_seed(0)
    try:
        split = fashion_mnist(train=True)
        images, labels = split.images[:640], split.labels[:640]
    except DataError:
        split = synthetic(640, seed=0)
        images, labels = split.images, split.labels
    model = build_model("cnn")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for i in range(5):
        opt.zero_grad()
        loss_fn(model(images[i * 128:(i + 1) * 128]), labels[i * 128:(i + 1) * 128]).backward()
        if i < 4:
            opt.step()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}
