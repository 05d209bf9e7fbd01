#!/usr/bin/env python3
"""docs/EXPERIMENTS.md from the log of ``scripts/experiment.py``: the paper's Tables I-III beside
ours, time to 85 % and 88 % test accuracy, bytes per node, whether the paper's orderings held,
and the figures (PNG, matplotlib): seconds per batch (as the paper's Fig. 6-7), loss per
node (Fig. 8-10) and test accuracy against wall time for every system.

    .venv/bin/python scripts/experiment_report.py run/experiment/experiment.jsonl
        [--out docs/EXPERIMENTS.md] [--figures docs/experiments]

Reads only the log: no training, no network (tests/test_experiment_report.py builds every
table and figure from a small recorded log).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib.expfigures import figures
from benchlib.explog import NAMES, ORDER, Log, Run, label, load
from benchlib.results import table

#: the paper's figures (Cui 2019, Section IV): VGG-19 on CIFAR-10, 4 workers, 300 Mbit/s
PAPER: dict[str, dict[str, Any]] = {
    "batch": {"decentralised": "0.58-0.73 s", "parameter server": "0.62-3.43 s"},
    "loss": {"decentralised": [0.3670, 0.2103, 0.1774, 0.1688], "parameter server": [0.4877], "single": [0.4192]},
    "train": {"decentralised": [86.7, 92.2, 95.3, 94.5], "parameter server": [96.7], "single": [96.5]},
    "test": {"decentralised": [79.9, 79.6, 79.8, 79.8], "parameter server": [79.5], "single": [83.8]},
}
#: the parameter servers a goal is judged against, each that ran
SERVERS = ("ps", "ps-m09", "ps-m06")
__all__ = ["NAMES", "report"]


def pct(values: list[float | None]) -> str:
    shown = [f"{100 * v:.1f} %" for v in values if v is not None]
    return ", ".join(shown) if shown else "-"


def secs(v: float | None) -> str:
    return "not reached" if v is None else f"{v:.1f} s"


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def group_text(configs: list[dict[str, Any]], base: dict[str, Any] | None = None) -> str:
    """``key=value`` of every setting, those that differ between the nodes as ``a, b, c`` (one per
    node); with ``base``, only the settings whose values are not all ``base``'s."""
    keys = [k for k in configs[0] if k != "node"]
    out = []
    for k in keys:
        vals = [c.get(k) for c in configs]
        if base is not None and all(v == base.get(k) for v in vals):
            continue
        if len(set(map(value, vals))) == 1:
            out.append(f"{k}={value(vals[0])}")
        else:
            out.append(f"{k}={', '.join(value(v) for v in vals)} (one per node)")
    return " ".join(out) or "the same"


def config_text(config: list[dict[str, Any]] | None) -> str:
    """A run's settings as it ran them (its result record's ``config``: every p2pnode node's
    resolved configuration, or a baseline's run fields): a parameter server's server, then what
    its workers set otherwise."""
    if not config:
        return "- (not recorded in this log)"
    servers = [c for c in config if c.get("node.role") == "ps"]
    others = [c for c in config if c.get("node.role") != "ps"]
    if servers and others:
        return (f"server: {group_text(servers)}; each of its {len(others)} workers, where it differs: "
                f"{group_text(others, servers[0])}")
    text = group_text(config)
    if config[0].get("training.shard") == "0/1" and len(config) == 1:
        text += " (shard 0/1: the whole training set)"
    return text


def load_text(r: Run) -> str:
    load = r.result.get("load")
    return f"{load['start'][0]:.1f} / {load['end'][0]:.1f}" if load else "-"


def capped_table(log: Log) -> str:
    """What each run capped, per condition and system (a stand-in run: which run it is)."""
    rows = []
    for cond in log.conditions():
        c = log.condition(cond)
        for r in log.in_cond(cond):
            if r.system == "single":
                what = "nothing (no network; one run stands for every condition)"
            elif r.cond != cond:
                what = (f"nothing: no server, so nothing of this system is capped here; its {r.cond} run stands "
                        f"in ({log.condition(r.cond).capped.get(r.system) or r.result.get('capped') or r.cond})")
            else:
                what = r.result.get("capped") or c.capped.get(r.system) or (
                    "nothing: every process on 127.0.0.1" if c.scope == "none" else
                    f"every machine's link{', ' + r.result['rate'] if r.result.get('rate') else ''} each way")
            rows.append([cond, NAMES.get(r.system, r.system), what])
    return table(["network", "system", "capped"], rows, "lll")


def tables(log: Log) -> str:
    out = []
    paper_t1 = table(["", "decentralised (paper)", "parameter server (paper)"],
                     [["seconds per batch", PAPER["batch"]["decentralised"], PAPER["batch"]["parameter server"]]])
    out.append(f"### Table I: seconds per batch\n\nThe paper (VGG-19, CIFAR-10, 300 Mbit/s):\n\n{paper_t1}\n")
    for cond in log.conditions():
        rows = []
        for r in log.in_cond(cond):
            b = r.batch_seconds()
            rows.append([label(r, cond)] + ([f"{min(b):.3f}", f"{statistics.median(b):.3f}",
                                             f"{quantile(b, 0.95):.3f}", f"{max(b):.3f}"] if b else ["-"] * 4))
        out.append(f"Ours, **{cond}** (seconds per batch of each worker, min / median / p95 / max):\n\n"
                   + table(["system", "min", "median", "p95", "max"], rows) + "\n")
    paper_rows = [["decentralised", ", ".join(f"{v:.4f}" for v in PAPER["loss"]["decentralised"]),
                   pct([v / 100 for v in PAPER["train"]["decentralised"]]),
                   pct([v / 100 for v in PAPER["test"]["decentralised"]])],
                  ["parameter server", f"{PAPER['loss']['parameter server'][0]:.4f}", "96.7 %", "79.5 %"],
                  ["single machine", f"{PAPER['loss']['single'][0]:.4f}", "96.5 %", "83.8 %"]]
    out.append("### Final loss (Fig. 8-10) and Tables II-III: training and test accuracy per node\n\n"
               "The paper, per node:\n\n" + table(["", "final loss", "training accuracy (Table II)",
                                                   "test accuracy (Table III)"], paper_rows) + "\n")
    for cond in log.conditions():
        rows = []
        for r in log.in_cond(cond):
            nodes = r.judged()
            rows.append([label(r, cond), ", ".join(f"{v:.4f}" for v in r.final_losses()) or "-",
                         pct([n.get("train_acc") for n in nodes]), pct([n.get("test_acc") for n in nodes])])
        out.append(f"Ours, **{cond}** (final loss: the mean of each node's last 5 logged batch losses; accuracy: "
                   f"the final model on the 10 000 test images and on the first 5 000 training images; a parameter "
                   f"server's row is its server's model):\n\n"
                   + table(["system", "final loss per node", "training accuracy", "test accuracy"], rows) + "\n")
    rows = []
    for cond in log.conditions():
        for r in log.in_cond(cond):
            if r.cond != cond:
                continue  # a stand-in's figures are in its own condition's rows
            nodes = r.result.get("nodes", [])
            moved = [n.get("bytes") for n in nodes if n.get("bytes") is not None]
            source = {n.get("bytes_source") for n in nodes} - {None}
            rows.append([cond, NAMES.get(r.system, r.system), secs(r.time_to(0.75)), secs(r.time_to(0.85)),
                         secs(r.time_to(0.88)),
                         f"{r.result.get('wall', 0):.0f} s",
                         (f"{statistics.median(moved) / 1e6:.0f} MB ({', '.join(sorted(source))})" if moved else "-")
                         + (f"; server {nodes[0]['bytes'] / 1e6:.0f} MB" if r.system.startswith("ps") and moved else ""),
                         load_text(r)])
    out.append("### Time to 85 % and 88 % test accuracy, and bytes per node\n\nTime from the first training step "
               "to the first periodic evaluation at or above the target (the mean over nodes of their latest "
               "evaluation; a parameter server's: the server's model). Bytes per node: the median node's link "
               "counters in both directions (link), what its HTTP client and server moved (http), or what "
               "all-reduce moves (computed). Load: this machine's 1-minute load average when the run started "
               "and when it ended (2 cores; 4 workers a run).\n\n"
               + table(["network", "system", "to 75 %", "to 85 %", "to 88 %", "training time", "bytes per node",
                        "load start / end"], rows)
               + "\n")
    return "\n".join(out)


def goals(log: Log) -> str:
    """The paper's orderings and our goals, judged from the log: met or not, with the numbers. With every link
    capped: p2pnode 3x sooner to 85 % than each parameter server, sooner than DDP and hivemind,
    within 1 pt of the single process; with only the server's link capped (the paper's setup):
    the paper's ordering, decentralised faster per batch and to 85 % than the parameter server."""
    lines = []
    for cond in log.conditions():
        scope = log.condition(cond).scope
        if scope not in ("every", "server"):
            continue
        by = {r.system: r for r in log.in_cond(cond)}
        p2p = [by[s] for s in ("p2p-defaults", "p2p-paper") if s in by]
        if not p2p:
            continue
        best = min(p2p, key=lambda r: r.time_to(0.85) or float("inf"))
        t = best.time_to(0.85)
        servers = [s for s in SERVERS if s in by]
        for server in servers:  # the paper's ordering (Table I; its Fig. 8-10 in time): decentralised first
            ours, theirs = best.batch_seconds(), by[server].batch_seconds()
            o = by[server].time_to(0.85)
            if not (ours and theirs):
                continue
            a, b = statistics.median(ours), statistics.median(theirs)
            per_batch, to_acc = a < b, t is not None and (o is None or t < o)
            verdict = "holds" if per_batch and to_acc else (
                "holds per batch only" if per_batch else "holds to 85 % only" if to_acc else "does not hold")
            where = "only the server's link capped, the paper's setup" if scope == "server" else "every link capped"
            lines.append(f"- {cond} ({where}): the paper's ordering, {label(best, cond)} against the "
                         f"{NAMES[server]}: median batch {a:.3f} s against {b:.3f} s; to 85 %: {secs(t)} against "
                         f"{secs(o)}: **{verdict}**.")
        if scope == "server":
            continue
        for other, factor in [*((s, 3.0) for s in servers or ["ps"]), ("ddp", 1.0), ("hivemind", 1.0)]:
            if other not in by:
                lines.append(f"- {cond}: {NAMES[other]} did not run.")
                continue
            o = by[other].time_to(0.85)
            met = t is not None and (o is None or o >= factor * t)
            ratio = f" ({o / t:.1f}x)" if t and o else ""
            lines.append(f"- {cond} (every link capped): {NAMES[best.system]} to 85 %: {secs(t)}; {NAMES[other]}: "
                         f"{secs(o)}{ratio}; goal {f'{factor:g}x sooner' if factor > 1 else 'sooner'}: "
                         f"**{'met' if met else 'missed'}**.")
        singles = [n["test_acc"] for n in by["single"].judged() if n.get("test_acc") is not None] if "single" in by else []
        if singles:
            single = statistics.mean(singles)
            accs = [n["test_acc"] for n in best.judged() if n.get("test_acc") is not None]
            gap = 100 * (single - min(accs)) if accs else None
            lines.append(f"- {cond}: {NAMES[best.system]} ends at {pct([min(accs)]) if accs else '-'} (worst node), "
                         f"the single process at {pct([single])} (same samples per node): within 1 pt: "
                         f"**{'met' if gap is not None and gap <= 1.0 else 'missed'}**.")
    return "\n".join(lines) or "- no capped condition in this log."


def last_line(failed: Any) -> str:
    """The line that says why a run failed (the last of its error output), shortened."""
    text = "\n".join(failed) if isinstance(failed, list) else str(failed or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def report(log: Path, out: Path, figdir: Path, command: str, notes: Path | None = None) -> str:
    """Write the page; ``notes`` (markdown), when given and present, is its "Reading" section:
    what a person concluded from these numbers, kept beside the log it reads."""
    data = load(log)
    meta, ratio, runs = data.meta, data.ratio, data.runs
    made = figures(data, figdir)
    # what each run was given (its result record), over the last command's list
    settings = {**meta.get("settings", {}), **{r.system: r.result["settings"] for r in runs.values()
                                               if r.result.get("settings")}}
    settings = {k: settings[k] for k in sorted(settings, key=lambda k: ORDER.index(k) if k in ORDER else 99)}
    # the values each system ran with, as its runs recorded them (one line per distinct set)
    as_run: dict[str, list[str]] = {}
    for r in runs.values():
        if r.result:
            text = config_text(r.result.get("config"))
            if text not in as_run.setdefault(r.system, []):
                as_run[r.system].append(text)
    params = f"{ratio['cnn_params']:,}".replace(",", " ") if ratio and ratio.get("cnn_params") else "421 642"
    took = "".join(f"- the command ran {e['runs']} runs in {e['wall'] / 60:.1f} minutes (wall time, start-up and "
                   f"final evaluations included); load average at its end {', '.join(f'{v:.1f}' for v in e['load'])} "
                   f"(1, 5, 15 min)\n" for e in data.ends)
    parts = [
        "# Experiments: the paper's evaluation, reproduced\n",
        ("Generated from a log of `scripts/experiment.py` by `scripts/experiment_report.py`: do not edit by hand. "
        "The paper (Cui 2019, Section IV) trains VGG-19 on CIFAR-10 on 5 machines with 300 Mbit/s links; we train "
        "the small CNN on Fashion-MNIST on one machine, every system on the same model, data (one shard per "
        "worker), batch size 64 and samples per worker, each machine in its own network namespace where a "
        "condition caps links (`tc tbf` both ways).\n"),
        "```\n" + "\n".join(f"sudo {c}" for c in meta.get("commands", []))
        + f"\n{command}  # this page alone, again from the log (the full run does it at its end)\n```\n",
        (f"- {meta.get('nodes', 4)} workers, {meta.get('samples', '?')} training samples "
        f"each{' (--quick)' if meta.get('quick') else ''}; periodic test evaluation every {meta.get('eval_every')} "
        f"steps on 1000 test images\n- common to every system: Fashion-MNIST, the small CNN ("
        f"{params} "
        f"parameters), worker i of a distributed system's {meta.get('nodes', 4)} trains on iid shard i (the single "
        f"process: shard 0/1, the whole training set), batch 64, samples per worker as above, "
        f"1 torch thread a process (OMP_NUM_THREADS=1); everything else each system ran with is in its row below\n"
        f"{took}"),
        "## Settings of every system\n\nWhat each system is, and the values it ran with as its runs recorded them "
        "in the log: for p2pnode's processes (single process, parameter server, p2pnode) every node's configuration "
        "as p2pnode's own parser resolved its command line, defaults included (a setting that differs between "
        "nodes: one value per node); for DDP and hivemind the fields of their run (benchlib.ddp.DdpRun, "
        "benchlib.hivemind_run.HivemindRun) and what their code fixes.\n\n"
        + table(["system", "what it is", "as run"],
                [[NAMES.get(k, k), v, " / ".join(as_run.get(k, [])) or "-"] for k, v in settings.items()], "lll")
        + "\n",
        "## What each condition caps\n\nEvery machine of a capped condition is a network namespace of its own on "
        "one bridge; a capped link is limited both ways (`tc tbf` on both ends of its veth). Where a condition "
        "caps nothing of a system, that system's run in another condition stands in for it (named in the row).\n\n"
        + capped_table(data) + "\n",
    ]
    if ratio:
        if "ratio" in ratio:
            parts.append(
                "## The ratio condition's link rate\n\nThe paper's dense model is VGG-19: "
                f"{ratio['paper_params'] / 1e6:.2f} M float32 parameters, {ratio['paper_params'] * 32 / 1e6:.0f} Mbit; "
                f"at 300 Mbit/s one dense transfer takes {ratio['paper_dense_transfer_s']} s, and its batches took at "
                f"least {ratio['paper_batch_s']} s (Table I), so a dense transfer costs "
                f"{ratio['paper_dense_transfer_s']} / {ratio['paper_batch_s']} = **{ratio['ratio']}** batches of "
                f"compute. Our CNN has {ratio['cnn_params']} parameters ({ratio['cnn_dense_mbit']} Mbit dense); one "
                f"training batch took {ratio['cnn_batch_one_core_s']} s on one core here (median of 20), and "
                f"{ratio['nodes']} workers share {ratio['cores']} cores, so a worker's batch takes "
                f"{ratio['cnn_batch_s']} s; the same ratio needs {ratio['cnn_dense_mbit']} Mbit / ({ratio['ratio']} x "
                f"{ratio['cnn_batch_s']} s) = {ratio['rate_mbit']} Mbit/s: links capped at **{ratio['rate']}**"
                + (f" (measured {ratio['measured']}" if ratio.get("measured") else "")
                + ("; this run reuses that measurement (benchlib/ratio.py), as the batch time on shared cores moves "
                   "with the load" if ratio.get("reused") else "") + (")" if ratio.get("measured") else "") + ".\n")
        else:
            parts.append(f"## The ratio condition's link rate\n\n{ratio.get('rate')}: {ratio.get('why')}\n")
    parts.append("## Tables\n\n" + tables(data))
    short = ("\nThis log is a `--quick` one: too few samples per worker for 85 % test accuracy (the time to 75 % "
             "stands in above). The goals are decided by the full run (every condition, 20 000 samples "
             "per worker), which this report does not include.\n" if meta.get("quick") else "")
    parts.append("## The paper's orderings: do they hold\n" + short + "\n" + goals(data) + "\n")
    failed = [f"- {r.name}: {last_line(r.result.get('failed')) or 'did not finish'}" for r in runs.values()
              if r.result and not r.result.get("ok", True)]
    if failed:
        parts.append("Runs that did not finish cleanly:\n\n" + "\n".join(failed) + "\n")
    if notes is not None and notes.exists():
        parts.append("## Reading\n\n" + notes.read_text().strip() + "\n")
    parts.append("## Figures\n")
    for path, caption in made:
        rel = os.path.relpath(path, out.parent)
        parts.append(f"![{caption}]({rel})\n\n{caption}. Made by:\n\n```\n{command}\n```\n")
    text = "\n".join(parts)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="the JSON-lines log of scripts/experiment.py")
    ap.add_argument("--out", default=str(ROOT / "docs" / "EXPERIMENTS.md"))
    ap.add_argument("--figures", default=str(ROOT / "docs" / "experiments"))
    ap.add_argument("--notes", default="", help="the page's Reading section (default: the log's name with "
                    ".notes.md in place of .jsonl, when that file exists)")
    args = ap.parse_args()
    log = Path(args.log)
    shown = os.path.relpath(log, ROOT) if log.resolve().is_relative_to(ROOT) else str(log)
    command = f".venv/bin/python scripts/experiment_report.py {shown}"
    if Path(args.out).resolve() != (ROOT / "docs" / "EXPERIMENTS.md").resolve():
        command += f" --out {args.out} --figures {args.figures}"
    notes = Path(args.notes) if args.notes else log.with_name(log.name.removesuffix(".jsonl") + ".notes.md")
    if args.notes:
        command += f" --notes {args.notes}"
    report(log, Path(args.out), Path(args.figures), command, notes)
    print(f"wrote {args.out} and its figures in {args.figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
