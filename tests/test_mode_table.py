"""docs/ALGORITHMS.md's table of which mode a node runs ("Gossip or the synchronous mode")
against the code that picks it (p2pnode/modes.py): every row's settings give the row's mode, and
every mode of the registry has a row."""

from __future__ import annotations

import re
from pathlib import Path

from p2pnode.config import Config, set_option
from p2pnode.modes import MODES, mode_for

DOC = Path(__file__).resolve().parents[1] / "docs" / "ALGORITHMS.md"


def rows() -> list[tuple[dict[str, str], str]]:
    """(settings, mode class name) for each row of the table whose header is '| settings | mode |'."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| settings | mode |"))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        settings_cell, mode_cell = line.split("|")[1:3]
        settings = dict(re.findall(r'`([a-z_.]+) = "([^"]*)"`', settings_cell))
        out.append((settings, re.findall(r"\(`(\w+Mode)`\)", mode_cell)[0]))
    return out


def test_every_row_of_the_docs_table_is_the_mode_the_code_picks() -> None:
    table = rows()
    assert len(table) >= 4
    for settings, mode in table:
        cfg = Config()
        for key, value in settings.items():
            set_option(cfg, key, value)
        assert mode_for(cfg).__name__ == mode, (settings, mode)
    assert {m.__name__ for m in MODES} == {mode for _, mode in table}


def test_the_defaults_run_gossip_and_an_explicit_setting_wins() -> None:
    assert mode_for(Config()).__name__ == "GossipMode"
    cfg = Config()
    set_option(cfg, "exchange.sync", "powersgd")
    assert mode_for(cfg).__name__ == "SyncMode"
