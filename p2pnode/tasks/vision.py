"""``training.task = "imagefolder"``: any torchvision classification model, by name, trained on
folders of images read from disk as they are drawn.

The data are ``torchvision.datasets.ImageFolder`` trees, one sub-folder per class::

    ROOT/train/cat/001.jpg   ROOT/train/dog/...   ROOT/val/cat/...   ROOT/val/dog/...

(``val`` or ``test`` holds the held-out images; both trees must have the same classes).
Images are decoded one at a time by the worker's DataLoader, with the usual transforms: a
random resized crop and a horizontal flip for training (``augment = false``: resize and centre
crop, as for evaluation), ImageNet's mean and standard deviation. The model is
``torchvision.models.get_model(model, num_classes=...)``, freshly initialised (no weights are
downloaded). torchvision is the ``vision`` extra: without it the task stops with one line
saying to install ``p2pnode[vision]``. Settings, in ``[task]``:

- ``model`` (``"resnet18"``): any name of ``torchvision.models.list_models(torchvision.models)``;
- ``root``: the folder holding ``train`` and ``val``; or ``train_dir`` and ``test_dir``;
- ``image_size`` (224), ``augment`` (true), ``crop_scale`` (0.08: the smallest share of the
  image a random crop keeps);
- ``batchnorm`` (``"averaged"``: running statistics averaged like weights; ``"local"``: each
  node keeps the statistics of its own data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from torch import nn

from p2pnode import extras
from p2pnode.tasks.base import ClassificationTask, TaskContext, TaskError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _folder(ctx: TaskContext, key: str, root: str, subs: tuple[str, ...]) -> Path:
    given = ctx.setting(key, "")
    if given:
        path = Path(given)
    elif root:
        found = [Path(root) / s for s in subs if (Path(root) / s).is_dir()]
        if not found:
            raise TaskError(f"task.root: {root} has no {' or '.join(subs)} folder")
        path = found[0]
    else:
        raise TaskError(f"task.root (or task.{key}) is required: the folder of one sub-folder per class")
    if not path.is_dir():
        raise TaskError(f"task.{key}: {path} is not a directory")
    return path


class ImageFolderTask(ClassificationTask):
    """A torchvision classifier on two ImageFolder trees."""

    def __init__(self, ctx: TaskContext) -> None:
        torchvision = extras.torchvision("it", TaskError)
        T = torchvision.transforms
        ImageFolder = torchvision.datasets.ImageFolder

        self.model_name = ctx.setting("model", "resnet18")
        if self.model_name not in torchvision.models.list_models(torchvision.models):
            raise TaskError(f"task.model: {self.model_name!r} is not a torchvision classification model")
        root = ctx.setting("root", "")
        train_dir = _folder(ctx, "train_dir", root, ("train",))
        test_dir = _folder(ctx, "test_dir", root, ("val", "test"))
        size = ctx.setting("image_size", 224)
        augment = ctx.setting("augment", True)
        scale = ctx.setting("crop_scale", 0.08)
        if size < 8 or not 0 < scale <= 1:
            raise TaskError("task.image_size must be >= 8 and task.crop_scale in (0, 1]")
        normalize = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        plain = T.Compose([T.Resize(size), T.CenterCrop(size), *normalize])
        train_tf = T.Compose([T.RandomResizedCrop(size, scale=(scale, 1.0)), T.RandomHorizontalFlip(),
                              *normalize]) if augment else plain
        self.train = ImageFolder(str(train_dir), transform=train_tf)
        self.test = ImageFolder(str(test_dir), transform=plain)
        if self.test.classes != self.train.classes:
            raise TaskError(f"{test_dir} and {train_dir} hold different classes "
                            f"({len(self.test.classes)} and {len(self.train.classes)} sub-folders)")
        self.num_classes = len(self.train.classes)
        batchnorm = ctx.setting("batchnorm", "averaged")
        if batchnorm not in ("averaged", "local"):
            raise TaskError(f"task.batchnorm: {batchnorm!r} is not averaged or local")
        self.keep_local = ("*.running_mean", "*.running_var") if batchnorm == "local" else ()
        self.name = f"imagefolder:{self.model_name}"

    def build_model(self) -> nn.Module:
        torchvision = extras.torchvision("it", TaskError)
        return torchvision.models.get_model(self.model_name, weights=None, num_classes=self.num_classes)

    def train_data(self) -> Any:
        return self.train

    def test_data(self) -> Any:
        return self.test

    def labels(self, dataset: Any) -> Sequence[int] | None:
        return list(dataset.targets) if dataset is self.train else None


def imagefolder(ctx: TaskContext) -> ImageFolderTask:
    """The factory behind the short name ``imagefolder``."""
    return ImageFolderTask(ctx)
