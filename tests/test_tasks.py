"""The task interface (p2pnode/tasks/): naming a task, its [task] settings, the built-in task
as the default, a user's task trained through the worker's DataLoader with a partition, what a
model sends and keeps (BatchNorm statistics averaged, integer counts, frozen and tied tensors),
fingerprints naming tasks, and bad tasks refused by ``p2pnode start`` with exit 2 and one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from p2pnode.config import Config, ConfigError, merge, set_option
from p2pnode.tasks.base import TaskError
from p2pnode.tasks.probe import probe
from p2pnode.wire.codec import decode, encode
from p2pnode.wire.payload import ArchitectureMismatch, ModelSpec, Snapshot
from p2pnode.worker.averaging import average_into
from p2pnode.worker.public import floating_state
from p2pnode.worker.training import ShardTrainer

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


def config(task: str = "task_fixtures:blobs", **settings: object) -> Config:
    return Config.from_dict({"training": {"task": task, "device": "cpu", "data": "synthetic", "synthetic_samples": 512,
                                          "warmup_samples": 0, "lr": 0.05, "batch_size": 32},
                             "task": dict(settings)})


def test_task_table_from_toml_and_set() -> None:
    cfg = Config()
    merge(cfg, {"training": {"task": "my_pkg.tasks:photos"}, "task": {"items": 100, "name": "x"}})
    set_option(cfg, "task.width", "32")
    assert cfg.task == {"items": 100, "name": "x", "width": "32"}
    assert Config.from_dict(cfg.to_dict()).task == cfg.task  # what the worker gets through the pipe
    with pytest.raises(ConfigError, match="task.deep: expected a string, number"):
        merge(Config(), {"task": {"deep": {"a": 1}}})
    with pytest.raises(ConfigError, match="training.task: 'two words' is neither"):
        Config.from_dict({"training": {"task": "two words"}})
    with pytest.raises(ConfigError, match="training.device: 'gpu'"):
        Config.from_dict({"training": {"device": "gpu"}})


def test_the_builtin_task_is_the_default() -> None:
    trainer = ShardTrainer(config(task=""))
    assert trainer.task_name == "cnn/synthetic"
    assert trainer.fingerprint.startswith("cnn/synthetic@")
    acc, loss, n = trainer.evaluate(100)
    assert n == 100 and 0 <= acc <= 1 and trainer.metrics == {"accuracy": acc, "loss": loss}


def test_a_task_by_import_string_trains_on_its_partition() -> None:
    cfg = config(items=384)
    cfg.training.shard, cfg.training.partition = "0/2", "classes:k=2"
    trainer = ShardTrainer(cfg)
    counts = np.bincount(trainer.train_split.labels.numpy(), minlength=4)
    assert (counts == 0).any() and counts.sum() == len(trainer.train_split), counts  # label skew: the task's labels
    before = trainer.evaluate(0)[0]
    for _ in range(120):
        trainer.train_step()
    assert trainer.samples == 120 * 32
    after = trainer.evaluate(0)[0]
    assert after > before + 0.15 and after >= 0.4, (before, after)  # learnt (its classes, not all four)


@pytest.mark.parametrize("task, settings, fragment", [
    ("task_fixtures:vector_loss", {}, "loss() returned a tensor of shape (32,), not a scalar"),
    ("task_fixtures:broken_model", {}, "build_model() raised RuntimeError: layer size must be positive"),
    ("task_fixtures:raises", {}, "building it raised FileNotFoundError: /data/photos does not exist"),
    ("task_fixtures:empty", {}, "its training data set is empty"),
    ("task_fixtures:half_buffer", {}, "its model cannot go on the wire: scale: dtype float64 is not supported"),
    ("task_fixtures:nothing", {}, "module 'task_fixtures' has no attribute 'nothing'"),
    ("no_such_module:task", {}, "cannot import 'no_such_module'"),
    ("no-such-task", {}, "no task named 'no-such-task' (known: builtin"),
    ("task_fixtures:blobs", {"itmes": 5},
     "task.itmes is not a setting of this task (it reads: adam, items, local_bn, width)"),
])
def test_bad_tasks_are_named_with_their_cause(task: str, settings: dict[str, object], fragment: str) -> None:
    result = probe(config(task, **settings))
    assert not result["ok"]
    assert result["error"].startswith(f"task '{task}': ") and fragment in result["error"], result
    assert "\n" not in result["error"]


def test_a_good_task_passes_the_probe() -> None:
    result = probe(config())
    assert result["ok"] and result["fingerprint"].startswith("task_fixtures:blobs@"), result


def test_what_a_model_sends_and_keeps() -> None:
    cfg = config()
    torch.manual_seed(0)
    ours, theirs = ShardTrainer(cfg).model, ShardTrainer(cfg).model
    sent = floating_state(ours)
    assert "norm.running_mean" in sent and "norm.running_var" in sent  # BatchNorm statistics: averaged
    assert "norm.num_batches_tracked" not in sent  # an integer count: local
    assert not any(k.startswith("frozen.") for k in sent)  # frozen: never sent
    assert "out.weight" in sent and "mirror.weight" not in sent  # tied: sent once
    assert list(ModelSpec.from_state_dict(sent, "t@x").names) == list(sent)
    with torch.no_grad():
        for v in floating_state(theirs).values():
            v.add_(1.0)
        theirs.norm.num_batches_tracked.fill_(99)
        theirs.frozen.weight.add_(5.0)  # a peer cannot move what is frozen: it is not sent
    frozen_before = ours.frozen.weight.clone()
    mean_before, out_before = ours.norm.running_mean.clone(), ours.out.weight.clone()
    average_into(ours, {k: v.clone() for k, v in floating_state(theirs).items()}, 0.5)
    assert torch.allclose(ours.norm.running_mean, mean_before + 0.5)
    assert torch.allclose(ours.out.weight, out_before + 0.5) and ours.mirror.weight is ours.out.weight
    assert int(ours.norm.num_batches_tracked) == 0
    assert torch.equal(ours.frozen.weight, frozen_before)


def test_a_payload_of_another_task_is_refused_naming_both() -> None:
    tensors = {"w": np.zeros(3, dtype=np.float32)}
    theirs = ModelSpec.from_state_dict(tensors, "charlm@0123456789abcdef")
    ours = ModelSpec.from_state_dict(tensors, "cnn/fashion-mnist@fedcba9876543210")
    data = encode(Snapshot(theirs.header("snapshot", "peer", "e", 1), tensors))
    with pytest.raises(ArchitectureMismatch) as err:
        decode(data, ours)
    assert str(err.value) == ("another task: the peer trains task 'charlm' (model 0123456789abcdef), "
                              "this node task 'cnn/fashion-mnist' (model fedcba9876543210)")


def test_task_error_is_a_value_error() -> None:
    assert issubclass(TaskError, ValueError)  # the worker reports it as "cannot train" (Failed)


def test_start_refuses_a_bad_task_with_exit_2(tmp_path: Path) -> None:
    """The real command (the other causes are the probe's, above: the same code, in-process)."""
    task, fragment = "task_fixtures:vector_loss", "not a scalar"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "p2pnode", "start", "--state-dir", str(tmp_path / "state"),
                           "--listen", "127.0.0.1:0", "--set", f"training.task={task}", "--set",
                           "training.device=cpu"], capture_output=True, text=True, timeout=120, env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and f"training.task: task '{task}': " in lines[0] and fragment in lines[0], proc.stderr
    assert not (tmp_path / "state").exists(), "a refused start writes nothing, and joins nothing"


def test_training_device_is_checked() -> None:
    """``cuda`` where torch sees no GPU is named in one line; ``auto`` falls back to the CPU."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal cannot be shown here")
    cfg = config()
    cfg.training.device = "cuda:0"
    assert probe(cfg)["error"] == ("task 'task_fixtures:blobs': training.device: cuda:0 asked for, but torch "
                                   "sees no CUDA GPU")
    cfg.training.device = "auto"
    trainer = ShardTrainer(cfg)
    assert trainer.device.type == "cpu" and next(trainer.model.parameters()).device.type == "cpu"


def test_a_task_keeps_batchnorm_statistics_local() -> None:
    trainer = ShardTrainer(config(local_bn=True))
    sent = floating_state(trainer.model)
    assert "norm.running_mean" not in sent and "norm.running_var" not in sent and "norm.weight" in sent
    peer = {k: v.clone() + 1.0 for k, v in sent.items()}
    before = trainer.model.norm.running_mean.clone()
    average_into(trainer.model, peer, 0.5)
    assert torch.equal(trainer.model.norm.running_mean, before)  # its own data's statistics, untouched


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_parameters_travel_and_average(dtype: torch.dtype) -> None:
    from p2pnode.compression.registry import build_sparsifier
    from p2pnode.wire.replica import ReplicaCache
    from p2pnode.worker.public import DeltaPublisher

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).to(dtype)
    spec = ModelSpec.from_state_dict(floating_state(model), "half@0")
    assert {t.dtype for t in spec.tensors} == {str(dtype).removeprefix("torch.")}
    pub = DeltaPublisher(model, spec, build_sparsifier("topk:density=0.5"), "peer", "e1", 0)
    replicas = ReplicaCache(4)
    replicas.apply("peer", pub.snapshot(0, 1.0), spec, 1 << 20)
    with torch.no_grad():
        model.weight.add_(0.25)
    replica = replicas.apply("peer", pub.publish(1, 1.0), spec, 1 << 20)
    for name, x in pub.xhat.items():  # the replica equals the publisher's float32 x_hat, bit for bit
        assert torch.equal(torch.as_tensor(replica.tensors[name]).reshape(-1), x)
    ours = torch.nn.Linear(6, 3).to(dtype)
    expected = (ours.weight.float() + torch.as_tensor(replica.tensors["weight"]).view(3, 6)) / 2
    average_into(ours, replica.tensors, 0.5)
    assert ours.weight.dtype == dtype
    assert torch.allclose(ours.weight.float(), expected, atol=1e-2)


def test_a_task_brings_its_own_optimizer() -> None:
    cfg = config(adam=True)
    cfg.training.lr, cfg.training.warmup_samples = 0.01, 320
    trainer = ShardTrainer(cfg)
    assert isinstance(trainer.optimizer, torch.optim.Adam)
    before = trainer.evaluate(0)[0]
    for _ in range(60):
        trainer.train_step()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)  # the node's schedule sets it
    assert trainer.evaluate(0)[0] > before + 0.2


def test_reader_processes_give_the_same_batches() -> None:
    """``training.loader_workers``: items read in other processes, the same batches in the same order."""
    here, there = config(), config()
    there.training.loader_workers = 1
    a, b = ShardTrainer(here), ShardTrainer(there)
    assert [a.train_step() for _ in range(20)] == [b.train_step() for _ in range(20)]
