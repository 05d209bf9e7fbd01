"""The figures of docs/EXPERIMENTS.md (``scripts/experiment_report.py``), as PNGs drawn with
matplotlib from the experiment's log: seconds per batch (the paper's Fig. 6-7), training loss
per node (Fig. 8-10) and test accuracy against wall time, every system, for each condition."""

from __future__ import annotations

from pathlib import Path

from benchlib.explog import TARGETS, Log, label


def figures(log: Log, outdir: Path) -> list[tuple[Path, str]]:
    """Every figure as a PNG in ``outdir``; (path, caption) of each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    made = []
    for cond in log.conditions():
        chosen = [r for r in log.in_cond(cond) if r.samples]
        if not chosen:
            continue
        fig, axes = plt.subplots(1, len(chosen), figsize=(3.2 * len(chosen), 2.8), squeeze=False)
        for ax, r in zip(axes[0], chosen):
            b = r.batch_seconds()
            if b:
                ax.hist(b, bins=30, color="tab:blue")
            ax.set_title(label(r, cond), fontsize=8)
            ax.set_xlabel("seconds per batch", fontsize=8)
            ax.tick_params(labelsize=7)
        axes[0][0].set_ylabel("batches", fontsize=8)
        fig.tight_layout()
        path = outdir / f"batch_seconds_{cond}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        made.append((path, f"Seconds per batch, {cond} (as the paper's Fig. 6-7)"))

        fig, axes = plt.subplots(1, len(chosen), figsize=(3.2 * len(chosen), 2.8), squeeze=False, sharey=True)
        for ax, r in zip(axes[0], chosen):
            for n, pts in sorted(r.samples.items()):
                xs = [p["samples"] for p in pts if p.get("loss") is not None]
                ys = [p["loss"] for p in pts if p.get("loss") is not None]
                if xs:
                    ax.plot(xs, ys, linewidth=0.7, label=f"node {n}")
            ax.set_title(label(r, cond), fontsize=8)
            ax.set_xlabel("samples (per node; the server: all)", fontsize=7)
            ax.tick_params(labelsize=7)
        axes[0][0].set_ylabel("training loss", fontsize=8)
        axes[0][-1].legend(fontsize=6)
        fig.tight_layout()
        path = outdir / f"loss_{cond}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        made.append((path, f"Training loss per node, {cond} (as the paper's Fig. 8-10)"))

        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for r in chosen:
            curve = r.accuracy_curve()
            if curve:
                ax.plot([c[0] for c in curve], [100 * c[1] for c in curve], label=label(r, cond))
        for target in TARGETS:
            ax.axhline(100 * target, color="grey", linewidth=0.5, linestyle=":")
        ax.set_xlabel("seconds since the first training step")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"Test accuracy against wall time, {cond}", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = outdir / f"accuracy_{cond}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        made.append((path, f"Test accuracy against wall time, every system, {cond}"))
    return made
