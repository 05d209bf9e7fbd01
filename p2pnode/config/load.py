"""From TOML and ``--set`` strings to a :class:`~p2pnode.config.schema.Config`, through msgspec.

Every source (the file, command-line options, ``--set SECTION.KEY=VALUE``) is laid as a nested
mapping over the current values, and the whole is decoded at once by ``msgspec.convert`` in its
lax mode (``--set`` gives strings: ``"0.1"`` becomes a float, ``"true"`` a bool). msgspec
checks types, choices and bounds; this module adds the one thing msgspec has no constraint for
(finite floats), splits a comma-separated string given for a list, and turns msgspec's message
(``Expected `float` > 0.0 - at `$.training.lr```) into this project's one line naming the key
and the value given (``training.lr: must be > 0, got -1``). A failed merge changes nothing.
"""

from __future__ import annotations

import math
import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import msgspec

from p2pnode.config.grammar import I64_MAX, MAX_SECONDS, ConfigError
from p2pnode.config.schema import Config, Table

#: what msgspec calls a type, as the message says it
_WANT = {"float": "a number", "int": "an integer", "bool": "true or false", "str": "a string",
         "array": "a list of strings", "object": "a table"}
_EXPECTED = re.compile(r"Expected `(?P<type>[^`]+)`(?:, got `(?P<got>[^`]+)`| (?P<op>[<>]=?) (?P<bound>\S+))?")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<key>[^`]+)`")
_ENUM = re.compile(r"Invalid enum value ")
_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def sections() -> tuple[str, ...]:
    """The TOML tables, in the schema's order ([task] last)."""
    return Config.__struct_fields__


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls, include_extras=True)


def _is_table(typ: Any) -> bool:
    return get_origin(typ) is None and isinstance(typ, type) and issubclass(typ, Table)


def _field_type(path: list[str | int]) -> Any:
    """The annotated type at ``path`` (section, key) of the schema, or None."""
    typ: Any = Config
    for step in path:
        if not _is_table(typ) or step not in _hints(typ):
            return None
        typ = _hints(typ)[str(step)]
    return typ


def _lookup(data: Any, path: list[str | int]) -> Any:
    for step in path:
        try:
            data = data[step]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _num(text: str) -> str:
    """``0.0`` -> ``0``, ``86400.0`` -> ``86400``: bounds as a person writes them."""
    return str(int(float(text))) if float(text).is_integer() else text


def _non_finite(value: Any) -> bool:
    try:
        return isinstance(value, (int, float, str)) and not isinstance(value, bool) and not math.isfinite(float(value))
    except (ValueError, OverflowError):
        return False


def translate(exc: msgspec.ValidationError, data: Any, where: str = "") -> ConfigError:
    """msgspec's message as one line naming the key (``where`` stands for msgspec's ``$``) and
    the value that ``data`` held there."""
    text = str(exc)
    m = _PATH.search(text)
    path: list[str | int] = []
    if m:
        path = [int(i) if i else key for key, i in _STEP.findall(m.group("path"))]
        text = text[:m.start()]
    dotted = ".".join(str(p) for p in path if isinstance(p, str))
    key = ".".join(k for k in (where, dotted) if k)
    value = _lookup(data, path)
    if (u := _UNKNOWN.match(text)) is not None:
        unknown, table = u.group("key"), _field_type(path)
        if not path and not where:
            return ConfigError(f"unknown section [{unknown}]; known: {', '.join(sorted(sections()))}")
        known = ", ".join(sorted(table.__struct_fields__)) if table is not None else ""
        return ConfigError(f"unknown key {key}.{unknown}; known keys of [{key}]: {known}")
    if _non_finite(value):  # inf or nan: never a meaningful step size, timeout or interval
        return ConfigError(f"{key}: expected a finite number, got {value!r}")
    if _ENUM.match(text):
        choices = get_args(_field_type(path))
        return ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}")
    if (e := _EXPECTED.match(text)) is not None:
        if e.group("op"):
            bound = e.group("bound")
            if bound in (str(I64_MAX), str(-I64_MAX - 1)):
                return ConfigError(f"{key}: {value} is out of range (64-bit integer)")
            if float(bound) == MAX_SECONDS and e.group("op") == "<=":
                return ConfigError(f"{key}: {float(value):g} s is more than a day ({MAX_SECONDS} s)")
            op = e.group("op")
            if e.group("type") == "int" and (op, bound) == (">=", "1"):  # msgspec's form of gt=0
                op, bound = ">", "0"
            return ConfigError(f"{key}: must be {op} {_num(bound)}, got {value}")
        if e.group("type") == "object":
            return ConfigError(f"[{key}] must be a table" if key else "configuration must be a table")
        want = _WANT.get(e.group("type"), f"`{e.group('type')}`")
        return ConfigError(f"{key}: expected {want}, got {value!r}")
    return ConfigError(f"{key}: {text}" if key else text)  # a message msgspec may add one day


def _prepare(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """What a person may write that msgspec's lax mode does not take: a comma-separated string
    for a list of strings, and yes/no for a boolean."""
    table = _field_type([section])
    if not _is_table(table):
        return values
    out = dict(values)
    for key, value in values.items():
        typ = _hints(table).get(key)
        if isinstance(value, str) and typ == list[str]:
            out[key] = [v for v in (s.strip() for s in value.split(",")) if v]
        elif isinstance(value, str) and typ is bool and value.lower() in ("yes", "no"):
            out[key] = value.lower() == "yes"
    return out


def _check_finite(cfg: Config, data: dict[str, Any]) -> None:
    for section in sections():
        table = getattr(cfg, section)
        if isinstance(table, Table):
            for key in table.__struct_fields__:
                value = getattr(table, key)
                if isinstance(value, float) and not math.isfinite(value):
                    raw = _lookup(data, [section, key])
                    raise ConfigError(f"{section}.{key}: expected a finite number, got {raw if raw is not None else value!r}")


def decode(data: Any) -> Config:
    """A whole configuration from nested mappings; missing keys take their defaults."""
    try:
        cfg = msgspec.convert(data, type=Config, strict=False)
    except msgspec.ValidationError as exc:
        raise translate(exc, data) from None
    _check_finite(cfg, data)
    return cfg


def merge(cfg: Config, data: dict[str, Any]) -> None:
    """Apply a nested mapping (as from TOML) onto ``cfg``; unknown keys are errors. On an
    error ``cfg`` is unchanged."""
    if not isinstance(data, dict):
        raise ConfigError("configuration must be a table")
    layered = cfg.to_dict()
    for section, values in data.items():
        if section not in layered:
            raise ConfigError(f"unknown section [{section}]; known: {', '.join(sorted(sections()))}")
        if not isinstance(values, dict):
            raise ConfigError(f"[{section}] must be a table")
        if section == "task":  # the task's own keys, read and checked by the task
            for key, value in values.items():
                if not isinstance(value, (str, int, float, bool, list)):
                    raise ConfigError(f"task.{key}: expected a string, number, boolean or list, got {value!r}")
        layered[section] = {**layered[section], **_prepare(section, values)}
    new = decode(layered)
    for section in sections():
        setattr(cfg, section, getattr(new, section))


def set_option(cfg: Config, dotted: str, value: str) -> None:
    """``--set training.lr=0.1`` style override."""
    section, sep, key = dotted.partition(".")
    if not sep:
        raise ConfigError(f"--set {dotted}: expected SECTION.KEY=VALUE")
    merge(cfg, {section: {key: value}})


def load_file(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None


#: a setting read as an integer: it travels to the worker as a 64-bit one
_Int64 = Annotated[int, msgspec.Meta(ge=-I64_MAX - 1, le=I64_MAX)]


def coerce(where: str, value: Any, typ: Any) -> Any:
    """One value as ``typ`` (bool, int, float, str or list[str]), the way a config key of that
    type takes it (strings from ``--set`` included); ConfigError naming ``where`` if it cannot.
    For settings read outside the schema: the [task] table (p2pnode/tasks/base.py)."""
    if isinstance(value, str) and typ == list[str]:
        value = [v for v in (s.strip() for s in value.split(",")) if v]
    elif isinstance(value, str) and typ is bool and value.lower() in ("yes", "no"):
        value = value.lower() == "yes"
    target = _Int64 if typ is int else typ
    try:
        out = msgspec.convert(value, type=target, strict=False)
    except msgspec.ValidationError as exc:
        raise translate(exc, value, where) from None
    if isinstance(out, float) and not math.isfinite(out):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    return out

