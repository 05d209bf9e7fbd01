"""Checks of the world a configuration names, run by ``p2pnode start`` before anything is written.

:func:`p2pnode.config.validate` judges values; this judges what they point at: files that must
exist and load (secret, dashboard token, TLS certificate, key and CA), a state directory that
can be written, a data set folder that exists, torchvision where the model needs it, and a listen address that can be bound. Each failure is a :class:`ConfigError`
naming the key and the file or address, so the CLI prints one line and exits 2 — an exit code
systemd's ``RestartPreventExitStatus=2`` does not restart, as no restart can fix it. Before this
a missing secret file exited 1 ("No such file or directory", no name) and was restarted every
5 s forever, and a busy port was found only after the state directory had been created.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import socket
import ssl
from pathlib import Path

from p2pnode.config import Config, ConfigError, parse_hostport
from p2pnode.extras import VISION_HINT


def _readable(key: str, path: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}: {path} does not exist")
    if not p.is_file():
        raise ConfigError(f"{key}: {path} is not a file")
    if not os.access(p, os.R_OK):
        raise ConfigError(f"{key}: {path} is not readable by this user")
    return p


def check_files(cfg: Config) -> None:
    n = cfg.node
    for key in ("secret_file", "dashboard_token_file"):
        path = getattr(n, key)
        if path and not _readable(f"node.{key}", path).read_bytes().strip():
            raise ConfigError(f"node.{key}: {path} is empty")
    for key in ("tls_cert", "tls_key", "tls_ca"):
        if getattr(n, key):
            _readable(f"node.{key}", getattr(n, key))
    if n.tls_cert:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(n.tls_cert, n.tls_key)
        except (ssl.SSLError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or str(exc)
            raise ConfigError(f"node.tls_cert: {n.tls_cert} with key {n.tls_key} does not load: {reason}") from None
        ca = n.tls_ca or n.tls_cert
        try:
            ssl.create_default_context(cafile=ca)
        except (ssl.SSLError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or str(exc)
            raise ConfigError(f"node.tls_ca: {ca} does not load as a CA bundle: {reason}") from None


#: where Debian's dataset-fashion-mnist puts the files (p2pnode/data.py reads them)
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def check_data(cfg: Config) -> None:
    """The data set's folder exists (the torch worker reads it; the stub worker reads nothing).
    Whether it holds the right files the worker says (exit 1): that needs its readers."""
    t = cfg.training
    if t.worker != "torch" or t.data == "synthetic" or t.task not in ("", "builtin"):
        return  # another task reads its own data: its probe checks it (p2pnode/tasks/check.py)
    if t.data_dir:
        if not Path(t.data_dir).is_dir():
            raise ConfigError(f"training.data_dir: {t.data_dir} does not exist or is not a directory")
    elif t.data == "fashion-mnist" and not Path(DEBIAN_FASHION_MNIST).is_dir():
        raise ConfigError(f"training.data: Fashion-MNIST is not installed ({DEBIAN_FASHION_MNIST} missing): "
                          "apt-get install dataset-fashion-mnist, or set training.data_dir")


def check_extras(cfg: Config) -> None:
    """torchvision (the ``vision`` extra) is installed when the built-in task needs it: every
    model but the small CNN. Looked up, not imported (the daemon stays torch-free); without
    this a CPU-only node asked for resnet18 started, then its worker failed (exit 1)."""
    t = cfg.training
    if t.worker != "torch" or t.task not in ("", "builtin") or t.model == "cnn":
        return
    try:
        found = importlib.util.find_spec("torchvision") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken half-import
        found = False
    if not found:
        raise ConfigError(f"training.model: {t.model} needs torchvision, which is not installed: {VISION_HINT}")


def check_state_dir(cfg: Config) -> None:
    """The state directory, or the nearest folder that exists above it, must be writable."""
    path = Path(cfg.node.state_dir).absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"node.state_dir: {cfg.node.state_dir} exists and is not a directory")
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"node.state_dir: {cfg.node.state_dir} cannot be written ({probe} is not writable)")


def check_listen(cfg: Config) -> None:
    """Bind the listen address once and let go: a busy port is named now, before the state
    directory or the worker exist. (Another process may take the port in between; the node's
    own bind then fails with exit 1.)"""
    host, port = parse_hostport(cfg.node.listen, "node.listen")
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"node.listen: {cfg.node.listen} is already in use by another process") from None
            raise ConfigError(f"node.listen: cannot bind {cfg.node.listen}: {exc.strerror or exc}") from None


def check(cfg: Config) -> None:
    """Everything above, files first (cheapest to fix), then the port, then a named task
    (loaded, built and tried on one batch in a subprocess: p2pnode/tasks/check.py)."""
    from p2pnode.tasks.check import check_task

    check_files(cfg)
    check_data(cfg)
    check_extras(cfg)
    check_state_dir(cfg)
    check_listen(cfg)
    check_task(cfg)
