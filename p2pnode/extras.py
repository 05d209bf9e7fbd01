"""Optional dependencies, imported where they are needed and named when they are missing.

torchvision is the ``vision`` extra (``pip install 'p2pnode[vision]'``): the built-in small CNN
on Fashion-MNIST or synthetic data never needs it, so a CPU-only node can run on PyTorch's CPU
wheel alone (no CPU build of torchvision is on PyPI, whose torchvision pins a CUDA torch). The
models, data sets and tasks that do need it import it through :func:`torchvision`, which turns
"not installed" into one line naming the extra instead of a traceback from deep in a worker.
"""

from __future__ import annotations

from types import ModuleType

VISION_HINT = "install p2pnode[vision] (pip install 'p2pnode[vision]')"


def torchvision(needed_by: str, error: type[Exception] = ValueError) -> ModuleType:
    """``import torchvision``, or ``error`` with one line saying what needs it and how to get
    it. An installed torchvision that fails to import (say, built for another torch) is named
    as such, not as missing."""
    try:
        import torchvision as tv
    except ImportError as exc:
        if exc.name == "torchvision":
            raise error(f"{needed_by} needs torchvision, which is not installed: {VISION_HINT}") from None
        raise error(f"{needed_by} needs torchvision, which failed to import ({exc}): {VISION_HINT}") from None
    return tv
