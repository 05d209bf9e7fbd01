"""Quasi-global momentum: the buffer follows how the model actually moved, averaging included."""

from __future__ import annotations

import copy

import torch

from p2pnode.worker.qgm import QuasiGlobalSGD


def step(opt: torch.optim.Optimizer, p: torch.nn.Parameter, grad: torch.Tensor) -> None:
    p.grad = grad.clone()
    opt.step()


def test_without_averaging_it_is_heavy_ball_momentum_on_the_own_moves() -> None:
    # minimise 0.5 * |x|^2 from x = 5: converges like momentum SGD does
    p = torch.nn.Parameter(torch.tensor([5.0, -3.0]))
    opt = QuasiGlobalSGD([p], lr=0.1, momentum=0.9)
    for _ in range(300):
        step(opt, p, p.detach())
    assert p.detach().abs().max() < 1e-3


def test_a_move_by_averaging_enters_the_buffer() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    opt = QuasiGlobalSGD([p], lr=0.5, momentum=0.9)
    step(opt, p, torch.zeros(3))  # first step: nothing moves, buffer stays 0
    with torch.no_grad():  # a peer's model pulls ours by -1 between two steps
        p.add_(torch.tensor([-1.0, 0.0, 2.0]))
    step(opt, p, torch.zeros(3))
    buf = opt.state[p]["buf"].clone()
    # displacement x_t - x_{t+1} = (+1, 0, -2); buffer = 0.9 * 0 + 0.1 * displacement / lr
    assert torch.allclose(buf, torch.tensor([0.2, 0.0, -0.4]))
    # ... and it keeps moving the model the network's way with no gradient at all: this step
    # moved it by -lr * 0.9 * buf; the next by -lr * 0.9 * (0.9 * buf + 0.1 * that move / lr)
    before = p.detach().clone()
    step(opt, p, torch.zeros(3))
    assert torch.allclose(p.detach() - before, torch.tensor([-0.0891, 0.0, 0.1782]), atol=1e-6)


def test_state_round_trips_through_a_checkpoint() -> None:
    p = torch.nn.Parameter(torch.ones(4))
    opt = QuasiGlobalSGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
    for i in range(3):
        step(opt, p, torch.full((4,), float(i)))
    q = torch.nn.Parameter(p.detach().clone())
    other = QuasiGlobalSGD([q], lr=0.1, momentum=0.9, weight_decay=0.01)
    other.load_state_dict(copy.deepcopy(opt.state_dict()))  # as through a checkpoint file
    step(opt, p, torch.ones(4))
    step(other, q, torch.ones(4))
    assert torch.equal(p.detach(), q.detach())
