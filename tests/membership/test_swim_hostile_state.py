"""A node's membership state files cannot be turned against it: identity.json and members.json
are bounded when written and checked when read; a file that fails the check is set aside with
a log line and the node starts (as a new node, or without remembered members)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from p2pnode.daemon import identity
from p2pnode.membership.base import MAX_INCARNATION


def test_identity_round_trip_bumps_the_incarnation(tmp_path: Path) -> None:
    first = identity.load_or_create(tmp_path)
    assert first.incarnation == 0
    first.raise_to(41)
    again = identity.load_or_create(tmp_path)
    assert (again.node_id, again.incarnation) == (first.node_id, 42)
    assert json.loads((tmp_path / "identity.json").read_text()) == {"node_id": first.node_id, "incarnation": 42}


def test_identity_never_records_an_incarnation_above_the_limit(tmp_path: Path) -> None:
    ident = identity.load_or_create(tmp_path)
    ident.raise_to(2**63)  # what a node that followed a 2^63-1 claim used to write
    ident.raise_to(MAX_INCARNATION + 1)
    assert ident.incarnation == 0
    ident.raise_to(MAX_INCARNATION - 1)
    assert identity.load_or_create(tmp_path).incarnation == MAX_INCARNATION  # the last usable value


@pytest.mark.parametrize("content", [
    b'{"node_id": "abc", "incarnation": 9223372036854775808}',  # 2^63: the old overflow
    b'{"node_id": "abc", "incarnation": 9007199254740991}',  # MAX_INCARNATION: no next life left
    b'{"node_id": "abc", "incarnation": -1}',
    b'{"node_id": "abc", "incarnation": 1.5}',
    b'{"node_id": "abc", "incarnation": true}',
    b'{"node_id": "", "incarnation": 1}',
    b'{"node_id": "a\\nb", "incarnation": 1}',
    b'{"node_id": "' + b"x" * 129 + b'", "incarnation": 1}',
    b'{"node_id": 7, "incarnation": 1}',
    b'{"incarnation": 1}',
    b'[1, 2]',
    b'{"node_id": "abc", "incarn',
    b'\xff\xfe garbage',
])
def test_an_invalid_identity_is_set_aside_and_the_node_starts_as_a_new_one(
        tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "identity.json").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="p2pnode.node"):
        ident = identity.load_or_create(tmp_path)
    assert ident.node_id != "abc" and ident.incarnation == 0
    aside = list(tmp_path.glob("identity.json.invalid-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content  # kept for the operator, untouched
    assert "identity.json is invalid" in caplog.text and "new node" in caplog.text
    assert identity.parse((tmp_path / "identity.json").read_bytes()) == (ident.node_id, 0)


def test_members_json_is_bounded_and_validated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert identity.load_hints(tmp_path, "127.0.0.1:1") == []  # none yet
    many = [f"10.0.{i // 250}.{i % 250 + 1}:7070" for i in range(5000)]
    identity.save_hints(tmp_path, many)
    saved = json.loads((tmp_path / "members.json").read_text())["addrs"]
    assert saved == many[:identity.MAX_SAVED_HINTS]
    assert identity.load_hints(tmp_path, many[0]) == many[1:identity.MAX_SAVED_HINTS]
    identity.save_hints(tmp_path, [])  # no live member: the last useful list is kept
    assert len(identity.load_hints(tmp_path, "x:1")) == identity.MAX_SAVED_HINTS
    for bad in (b'{"addrs": ["no-port"]}', b'{"addrs": "10.0.0.1:7070"}', b"{}", b"not json",
                b'{"addrs": ["' + b"h" * 300 + b':1"]}', b" " * (identity.MAX_HINTS_FILE_BYTES + 1)):
        (tmp_path / "members.json").write_bytes(bad)
        with caplog.at_level(logging.WARNING, logger="p2pnode.node"):
            assert identity.load_hints(tmp_path, "x:1") == []
        assert not (tmp_path / "members.json").exists()
    assert len(list(tmp_path.glob("members.json.invalid-*"))) == 6  # each kept
    assert "members.json is invalid" in caplog.text
