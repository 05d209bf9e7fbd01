"""DiLoCo's outer step (p2pnode/worker/outer.py): Nesterov on the round's pseudo-gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from p2pnode.worker.outer import OuterNesterov


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_first_round_steps_lr_times_one_plus_momentum_of_the_pseudo_gradient() -> None:
    model = _model()
    outer = OuterNesterov(model, lr=0.7, momentum=0.9)
    start = _params(model)
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.1)  # the round's local steps (and averaging) moved every weight by -0.1
    outer.step(model)
    for name, p in model.named_parameters():
        # delta = 0.1, v = 0.1, x = start - 0.7 * (0.1 + 0.9 * 0.1)
        torch.testing.assert_close(p.detach(), start[name] - 0.7 * 0.19)
        torch.testing.assert_close(outer.anchor[name], p.detach())


def test_momentum_carries_over_rounds_and_a_still_round_still_moves() -> None:
    model = _model()
    outer = OuterNesterov(model, lr=1.0, momentum=0.5)
    start = _params(model)
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(1.0)
    outer.step(model)  # delta 1, v 1: x = start - (1 + 0.5) = start - 1.5
    outer.step(model)  # nothing moved: delta 0, v 0.5: x = anchor - 0.25
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), start[name] - 1.75)


def test_restart_forgets_momentum_and_anchors_at_the_new_model() -> None:
    model = _model()
    outer = OuterNesterov(model, lr=0.7, momentum=0.9)
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(1.0)
    outer.step(model)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(3.0)  # a peer's model adopted
    outer.restart(model)
    outer.step(model)  # nothing moved since the restart and no momentum: the model stays
    for p in model.parameters():
        assert torch.all(p == 3.0)


def test_state_round_trips_and_refuses_another_model() -> None:
    model = _model()
    outer = OuterNesterov(model, lr=0.7, momentum=0.9)
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.5)
    outer.step(model)
    other = OuterNesterov(_model(), lr=0.7, momentum=0.9)
    other.load_state_dict(outer.state_dict())
    for name in outer.anchor:
        torch.testing.assert_close(other.anchor[name], outer.anchor[name])
        torch.testing.assert_close(other.velocity[name], outer.velocity[name])
    with pytest.raises(ValueError, match="does not fit"):
        OuterNesterov(nn.Linear(3, 3), 0.7, 0.9).load_state_dict(outer.state_dict())


@pytest.mark.parametrize(("lr", "momentum"), [(0.0, 0.9), (0.7, 1.0), (0.7, -0.1)])
def test_bad_settings_are_refused(lr: float, momentum: float) -> None:
    with pytest.raises(ValueError):
        OuterNesterov(_model(), lr, momentum)
