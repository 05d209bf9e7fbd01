"""The model names a node can train and the input each expects, torch-free.

Configuration validation runs in the daemon, which never builds a model; keeping this table
apart from :mod:`p2pnode.models` (torch; torchvision for some) keeps torch out of the daemon process.
"""

from __future__ import annotations

#: classes of every built-in data set (Fashion-MNIST, CIFAR-10, synthetic)
NUM_CLASSES = 10

#: input shape (channels, height, width) each model expects
MODEL_INPUTS: dict[str, tuple[int, int, int]] = {
    "cnn": (1, 28, 28),
    "resnet18": (3, 32, 32),
    "vgg11": (3, 32, 32),
    "vgg19": (3, 32, 32),
}
