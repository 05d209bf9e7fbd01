"""``p2pnode start`` runs a node in the foreground; ``p2pnode status`` shows one readably."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from p2pnode import __version__

if TYPE_CHECKING:
    from p2pnode.config import Config

# p2pnode.config (msgspec) is imported where a command needs it: `p2pnode install-service` runs
# from a wheel installed with no dependencies (tests/test_release.py).


def _start_parser(sub: Any) -> None:
    p = sub.add_parser("start", help="run a node in the foreground (logs to stderr)",
                       description="Run a node. With no --seed it starts a new cluster and trains alone "
                                   "until peers join.")
    p.add_argument("--config", metavar="FILE", help="TOML config file (see conf/node.toml)")
    p.add_argument("--seed", action="append", metavar="HOST:PORT", help="a member to join through (repeatable)")
    p.add_argument("--listen", metavar="HOST:PORT", help="address of the HTTP server (port 0: any free one)")
    p.add_argument("--advertise", metavar="HOST:PORT", help="address peers should use, if not --listen")
    p.add_argument("--state-dir", metavar="DIR", help="node id, checkpoints")
    p.add_argument("--data", metavar="NAME", help="fashion-mnist, cifar10 or synthetic")
    p.add_argument("--data-dir", metavar="DIR", help="folder holding the data set's files")
    p.add_argument("--model", metavar="NAME", help="cnn, resnet18, vgg11 or vgg19")
    p.add_argument("--shard", metavar="I/N", help="train on the I-th of N disjoint shards")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config key, e.g. --set exchange.timeout=1.5 (repeatable)")


def build_config(args: argparse.Namespace) -> Config:
    from p2pnode.config import (
        Config,
        ConfigError,
        load_file,
        merge,
        set_option,
        validate,
    )

    cfg = Config()
    if args.config:
        merge(cfg, load_file(args.config))
    flags = {"node": {"seeds": args.seed, "listen": args.listen, "advertise": args.advertise,
                      "state_dir": args.state_dir},
             "training": {"data": args.data, "data_dir": args.data_dir, "model": args.model, "shard": args.shard}}
    merge(cfg, {sec: {k: v for k, v in vals.items() if v is not None} for sec, vals in flags.items()})
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item}: expected SECTION.KEY=VALUE")
        set_option(cfg, key.strip(), value.strip())
    validate(cfg)
    return cfg


def cmd_start(args: argparse.Namespace) -> int:
    from p2pnode.daemon import early_signals

    early_signals.install()  # SIGTERM from now on is a graceful stop, not a kill (docs/OPERATIONS.md)
    from p2pnode import preflight
    from p2pnode.config import ConfigError

    try:
        cfg = build_config(args)
        preflight.check(cfg)  # files, state dir, port: before anything is written
    except ConfigError as exc:
        print(f"p2pnode: config error: {exc}", file=sys.stderr)
        return 2
    from p2pnode import logfmt

    logfmt.setup(cfg.node.log_level, cfg.logging.format, "daemon", "%(asctime)s %(name)s %(levelname)s %(message)s")

    import uvloop

    from p2pnode.daemon.node import Node

    try:
        node = Node(cfg)
    except (OSError, RuntimeError) as exc:
        print(f"p2pnode: cannot start: {exc}", file=sys.stderr)
        return 1
    logfmt.set_node(node.node_id)
    try:
        code = uvloop.run(node.run())
    except OSError as exc:
        print(f"p2pnode: {exc}", file=sys.stderr)
        return 1
    # The node has left, checkpointed and closed everything. Skip the interpreter's teardown:
    # with torch loaded it takes 1-3 s on a busy machine, inside the 10 s stop budget.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _mode_lines(m: Any) -> list[str]:
    """The mode, the setting and why (exchange.sync = "auto": config/mode_rule.py), and its advice."""
    if not isinstance(m, dict) or "name" not in m:
        return []  # a node from before status named its mode
    return ([f"mode      {m['name']}  (exchange.sync = {m.get('setting')}: {m.get('why')})"]
            + ([f"advice    {m['advice']}"] if m.get("advice") else []))


def render_status(s: dict[str, Any]) -> str:
    t, ex, b = s["training"], s["exchanges"], s["bytes"]
    lines = [
        f"node {s['node_id']} at {s['addr']}  (p2pnode {s['version']}, up {s['uptime_s']:.0f} s, "
        f"incarnation {s['incarnation']})",
        *_mode_lines(s.get("mode")),
        f"training  step {t['step']}  samples {t['samples']}  loss {_fmt(t['loss'])}  lr {_fmt(t['lr'])}"
        f"{'  (done)' if t['done'] else ''}",
        f"test      accuracy {_fmt(t['accuracy'])} at step {t['eval_step']} on {t['eval_samples']} images"
        + "".join(f"  {k} {_fmt(v)}" for k, v in sorted((t.get("metrics") or {}).items())
                  if k not in ("accuracy", "loss"))
        + ("  (the model agreed on: consensus finish)" if t.get("eval_consensus") else ""),
        f"worker    {'running' if t['worker_alive'] else 'DOWN'}  restarts {t['worker_restarts']}  "
        f"last checkpoint at step {_fmt(t['last_checkpoint_step'])}",
        f"exchanges done {ex['done']}  skipped {ex['skipped']}  not modified {ex['not_modified']}  "
        f"rejected {ex['rejected']}",
        f"bytes     model received {b['model_received']}  model served {b['model_served']}"
        + (f"  in all sent {b['sent']}  received {b['received']}"  # a mode's own too (the all-reduce's)
           if (b.get("sent"), b.get("received")) not in ((None, None), (b['model_served'], b['model_received']))
           else ""),
    ]
    c = s.get("consensus") or {}
    if t["done"] and "max_distance" in c:  # gossip's consensus finish (docs/ALGORITHMS.md)
        lines.append(f"consensus {'reached' if c['reached'] else 'not yet'}  largest distance "
                     f"{_fmt(c['max_distance'])} (tolerance {_fmt(c['tolerance'])})  peers measured {c['peers']}"
                     + (f"  alive but left out {c['left_out']}" if c.get("left_out") else ""))
    if "sync" in s:  # exchange.sync: the all-reduce instead of the exchanges above
        y = s["sync"]
        lines.append(f"sync      {y['mode']} rank {y['rank']} {y.get('values', 'float16')}  reducer {y['reducer']}  rounds {y['rounds']}  "
                     f"included {y['included']}  missed {y['missed']}  replayed {y.get('replayed', 0)}  "
                     f"failures {y['failures']}  last count {y['last_count']}  received {b.get('sync_received', 0)}"
                     + (f"  not waited for (slow): {' '.join(y['slow'])}" if y.get("slow") else "")
                     + (f"  slow, waited for: {' '.join(y['waited_for'])}" if y.get("waited_for") else "")
                     + (f"  stood down until round {y['resting_until']}" if y.get("resting_until") else "")
                     + "".join(f"  passing over {rid} until round {until}"
                               for rid, until in sorted((y.get("passed_over") or {}).items()))
                     + "".join(f"  outliers from {node}: {count}"  # exchange.sync_outlier, as the reducer here saw them
                               for node, count in sorted((y.get("outlier_nodes") or {}).items())))
    lines.append("members:")
    peers = s.get("peers", {})
    for mb in s["members"]:
        p = peers.get(mb["node_id"], {})
        me = " (this node)" if mb["node_id"] == s["node_id"] else ""
        extra = (f"  ok {p['ok']} failed {p['failed']}" + (f"  last error: {p['last_error']}" if p.get("last_error")
                                                            else "")) if p else ""
        lines.append(f"  {mb['node_id']}  {mb['addr']:<21} {mb['state']:<8}{me}{extra}")
    return "\n".join(lines)


def _read_credential(path: str | None, what: str) -> bytes | None:
    from p2pnode.config import ConfigError

    if not path:
        return None
    try:
        return open(path, "rb").read().strip() or None
    except OSError as exc:
        raise ConfigError(f"cannot read the {what}: {exc}") from None


def cmd_status(args: argparse.Namespace) -> int:
    from p2pnode.config import ConfigError
    from p2pnode.watch import Target, fetch_json, watch

    try:
        secret = _read_credential(args.secret_file, "secret")
        token = _read_credential(args.token_file, "dashboard token")
    except ConfigError as exc:
        print(f"p2pnode: {exc}", file=sys.stderr)
        return 2
    if args.interval <= 0:
        print("p2pnode: --interval must be > 0", file=sys.stderr)
        return 2
    if args.cafile and not os.path.isfile(args.cafile):
        print(f"p2pnode: --cafile: {args.cafile} does not exist", file=sys.stderr)
        return 2
    if args.cafile and not args.address.startswith("https://"):
        args.address = f"https://{args.address.removeprefix('http://')}"  # a CA means TLS
    target = Target(args.address, args.timeout, secret, token.decode() if token else None, args.cafile)
    if args.watch:
        return watch(target, args.interval)
    try:
        data = fetch_json(target, "/v1/status")
    except urllib.error.HTTPError as exc:
        hint = ""
        if exc.code == 401:
            hint = (" (the node requires the cluster secret: give --secret-file FILE, or --token-file FILE)"
                    if not secret and not token else " (a different secret or token than the node's?)")
        print(f"p2pnode: no status from {args.address}: HTTP {exc.code} {exc.reason}{hint}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        low = str(reason).lower()
        hint = ""
        if not args.address.startswith("https://") and ("reset" in low or "closed connection" in low):
            hint = " (a TLS node? give https://HOST:PORT and --cafile FILE)"
        elif "certificate verify failed" in low:
            hint = " (give --cafile FILE: the node's CA, node.tls_ca, or its certificate)"
        print(f"p2pnode: no status from {args.address}: {reason}{hint}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    try:
        text = render_status(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        print(f"p2pnode: {args.address} did not answer a p2pnode status document ({type(exc).__name__}: {exc}); "
              "--json shows what it sent", file=sys.stderr)
        return 1
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="p2pnode", description="Peer-to-peer training daemon")
    parser.add_argument("--version", action="version", version=f"p2pnode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _start_parser(sub)
    st = sub.add_parser("status", help="print a node's status, or watch the cluster's (--watch)")
    st.add_argument("address", nargs="?", default="127.0.0.1:7070", metavar="HOST:PORT",
                    help="the node to ask (https://HOST:PORT for a TLS cluster)")
    st.add_argument("--json", action="store_true", help="raw JSON")
    st.add_argument("--watch", action="store_true",
                    help="the cluster table of every member, redrawn in place until Ctrl-C")
    st.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between redraws (--watch)")
    st.add_argument("--timeout", type=float, default=5.0)
    st.add_argument("--secret-file", metavar="FILE", help="the cluster secret, for a node that requires signatures")
    st.add_argument("--token-file", metavar="FILE", help="or the node's read-only dashboard token")
    st.add_argument("--cafile", metavar="FILE", help="CA bundle for https:// (default: the system's)")
    ins = sub.add_parser("install-service", help="install the systemd unit, /etc/p2pnode/node.toml and the docs",
                         description="Install p2pnode.service, the reference node.toml (an existing one is kept) "
                                     "and the docs where the unit names them (docs/OPERATIONS.md).")
    ins.add_argument("--root", default="/", metavar="DIR", help="install under DIR instead of / (staging, tests)")
    ins.add_argument("--exec", dest="exe", metavar="PATH",
                     help="the p2pnode the unit runs (default: this virtual environment's, else /usr/local/bin/p2pnode)")
    args = parser.parse_args(argv)
    if args.command == "start":
        return cmd_start(args)
    if args.command == "install-service":
        from p2pnode import install

        return install.main(args.root, args.exe)
    return cmd_status(args)


if __name__ == "__main__":
    sys.exit(main())
