"""The small CNN computes in channels-last on the CPU (p2pnode/models.py) and nothing else
changes: its outputs and gradients equal the NCHW ones to float rounding, and its parameters,
their gradients and its state dict keep the plain contiguous layout the wire and the
checkpoints are written from."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from p2pnode.models import SmallCNN, build_model, fingerprint


def nchw(model: SmallCNN, x: torch.Tensor) -> torch.Tensor:
    """The forward pass as it was before: the layers on the batch as it comes."""
    return model.classifier(model.features(x))


def test_channels_last_changes_no_result_and_no_parameter_layout() -> None:
    torch.manual_seed(0)
    model = build_model("cnn")
    assert isinstance(model, SmallCNN)
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))

    F.cross_entropy(nchw(model, x), y).backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    pooled: list[torch.Tensor] = []  # what the first max-pool gets: channels-last, the fast path
    hook = model.features[2].register_forward_hook(lambda _m, args, _out: pooled.append(args[0]))
    out = model(x)
    hook.remove()
    assert pooled and pooled[0].is_contiguous(memory_format=torch.channels_last) and not pooled[0].is_contiguous()
    F.cross_entropy(out, y).backward()

    torch.testing.assert_close(out, nchw(model, x), rtol=1e-5, atol=1e-5)
    assert plain.keys() == {n for n, _ in model.named_parameters()}
    for name, param in model.named_parameters():
        assert param.grad is not None
        torch.testing.assert_close(param.grad, plain[name], rtol=1e-4, atol=1e-5)
        assert param.is_contiguous() and param.grad.is_contiguous(), name
    assert all(t.is_contiguous() for t in model.state_dict().values())


def test_the_fingerprint_is_the_architectures_not_the_layouts() -> None:
    """A node of an earlier version (NCHW) and one of this version train the same model."""
    torch.manual_seed(0)
    model = build_model("cnn")
    before = fingerprint(model)
    model(torch.randn(2, 1, 28, 28))
    assert fingerprint(model) == before == fingerprint(build_model("cnn"))
