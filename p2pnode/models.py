"""Model architectures a node can train, by name.

Every node of a cluster must build the same architecture: the wire format carries an
architecture fingerprint (see :func:`fingerprint`) so a peer with another model is refused
before any of its numbers touch ours.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from p2pnode import extras
from p2pnode.model_names import MODEL_INPUTS

__all__ = ["MODEL_INPUTS", "SmallCNN", "build_model", "fingerprint"]


class SmallCNN(nn.Module):
    """2 conv + 2 fc, about 0.42 M parameters: the reference model for Fashion-MNIST."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * side * side, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # On the CPU, in channels-last layout: PyTorch's NCHW max-pool was a third of this
        # model's training step (a fifth of the whole worker); in channels-last the step is
        # about 1.3x faster and the forward pass about 2x (one thread, batch 32 and 64:
        # docs/BENCHMARKS.md, "Channels-last"). Only the activations change layout: the
        # parameters, their gradients and so the wire and the checkpoints stay as they were,
        # and the results equal the NCHW ones to float rounding. Not measured on a GPU: left as is.
        if x.device.type == "cpu" and x.dim() == 4:
            x = x.to(memory_format=torch.channels_last)
        return self.classifier(self.features(x))


def build_model(name: str, num_classes: int = 10, in_channels: int | None = None) -> nn.Module:
    """Build a freshly initialised model; raises ``ValueError`` for an unknown name.

    ``resnet18`` and the VGGs are torchvision's, adapted to 32x32 inputs (CIFAR-10), as the
    paper trained VGG-19 on CIFAR-10. Only they import torchvision (the ``vision`` extra): the
    small CNN trains on a node with PyTorch alone (p2pnode/extras.py).
    """
    if name not in MODEL_INPUTS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_INPUTS)}")
    channels, size, _ = MODEL_INPUTS[name]
    channels = in_channels if in_channels is not None else channels
    if name == "cnn":
        return SmallCNN(channels, num_classes, size)
    tvm = extras.torchvision(f"model {name!r}").models
    if name == "resnet18":
        model = tvm.resnet18(num_classes=num_classes)
        # 32x32 inputs: a 3x3 stem without the max-pool keeps spatial resolution.
        model.conv1 = nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
        return model
    builder = {"vgg11": tvm.vgg11_bn, "vgg19": tvm.vgg19_bn}[name]
    model = builder(num_classes=num_classes)
    if channels != 3:
        model.features[0] = nn.Conv2d(channels, 64, 3, padding=1)
    # 32x32 input leaves a 1x1 feature map: pool to 1x1 and use a small classifier.
    model.avgpool = nn.AdaptiveAvgPool2d(1)
    model.classifier = nn.Sequential(nn.Linear(512, 512), nn.ReLU(True), nn.Linear(512, num_classes))
    return model


def fingerprint(model: nn.Module) -> str:
    """A short hash of parameter names, shapes and dtypes: equal iff the architectures match."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return h.hexdigest()[:16]
