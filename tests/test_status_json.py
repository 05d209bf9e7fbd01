"""Status is strict JSON: a diverged node's NaN or infinite figures are null, never ``NaN``
(which browsers and most JSON parsers refuse, taking the whole document with it)."""

from __future__ import annotations

import json

from p2pnode.daemon.state import TrainingState


def test_non_finite_figures_are_null() -> None:
    state = TrainingState(loss=float("nan"), test_loss=float("inf"), accuracy=0.1, lr=float("-inf"))
    out = json.loads(json.dumps(state.to_json(), allow_nan=False))
    assert out["loss"] is None and out["test_loss"] is None and out["lr"] is None
    assert out["accuracy"] == 0.1
