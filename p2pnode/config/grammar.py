"""The error every configuration problem raises, and the grammars of values that are strings on
the outside: ``HOST:PORT`` addresses, ``I/N`` shards, node ids and task names. Imported by the
schema, the loader, the checks and by modules outside the package (the daemon binds with
:func:`parse_hostport`, its identity file and membership messages read node ids by
:func:`node_id_error`, the task registry resolves what :func:`task_name_error` lets through):
kept here, below them all, so that checking a configuration imports none of them."""

from __future__ import annotations

import re


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the file: one line naming the
    key (``training.lr: must be > 0, got -1``); the CLI prints it and exits with code 2."""


#: the longest timeout or interval accepted, seconds: anything longer is a typo, not a plan
MAX_SECONDS = 86400
#: integers travel to the worker as 64-bit integers (msgpack on the pipe)
I64_MAX = 2**63 - 1

#: characters in a node id (a membership message carries it; identity.json holds it)
MAX_ID = 128

_IMPORT_STRING = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_SHORT_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")

#: a host name or IPv4 address, or an IPv6 address in brackets (with an optional zone)
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+(%[A-Za-z0-9._-]+)?\]")


def parse_hostport(value: str, key: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` only: no scheme, no path, one address (a mistaken ``http://h:p`` or
    ``a:1,b:2`` is refused here, not 18 s later when the join fails)."""
    host, sep, port = value.rpartition(":")
    if not sep or not _HOST.fullmatch(host) or not port.isdigit() or not 0 <= int(port) <= 65535:
        hint = ""
        if "://" in value:
            hint = " (no scheme: write HOST:PORT; TLS is node.tls_cert)"
        elif "," in value or " " in value.strip():
            hint = " (one address each: repeat --seed, or a TOML list)"
        elif ":" in host and not host.startswith("["):
            hint = " (an IPv6 address goes in brackets: [::1]:7070)"
        raise ConfigError(f"{key}: {value!r} is not HOST:PORT{hint}")
    return host.strip("[]"), int(port)


def parse_shard(value: str) -> tuple[int, int]:
    """``I/N`` with ``0 <= I < N``: the I-th of N disjoint shards of the training set."""
    i, sep, n = value.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or not 0 <= int(i) < int(n):
        raise ConfigError(f"training.shard: {value!r} is not I/N with 0 <= I < N")
    return int(i), int(n)


def node_id_error(node_id: object) -> str | None:
    """Why ``node_id`` cannot be a node id (None: it can): 1..MAX_ID printable characters, no
    space at either end, what a membership message can carry and identity.json hold."""
    if (isinstance(node_id, str) and 0 < len(node_id) <= MAX_ID and node_id.isprintable()
            and node_id.strip() == node_id):
        return None
    return f"node_id must be 1..{MAX_ID} printable characters, no space at either end, got {node_id!r:.60}"


def task_name_error(value: str) -> str | None:
    """Why ``value`` cannot name a task (None: it can): ``MODULE:ATTRIBUTE`` or a short name."""
    if not value or _IMPORT_STRING.fullmatch(value) or _SHORT_NAME.fullmatch(value):
        return None
    return f"{value!r} is neither MODULE:ATTRIBUTE nor a short name"
