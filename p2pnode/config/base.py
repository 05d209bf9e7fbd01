"""The error every configuration problem raises, and the parsers of values that are strings on
the outside: ``HOST:PORT`` addresses and ``I/N`` shards. Imported by the schema, the loader, the
checks and by modules outside the package (the daemon binds with :func:`parse_hostport`)."""

from __future__ import annotations

import re


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the file: one line naming the
    key (``training.lr: must be > 0, got -1``); the CLI prints it and exits with code 2."""


#: the longest timeout or interval accepted, seconds: anything longer is a typo, not a plan
MAX_SECONDS = 86400
#: integers travel to the worker as 64-bit integers (msgpack on the pipe)
I64_MAX = 2**63 - 1

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
