"""The plots of the learning curve: ``curve.png`` of one curve folder (``plot_curve``) and ``results/
gap-vs-labels.png`` across folders and datasets (``plot_gap``, drawn by ``epr experiment index``)."""

from __future__ import annotations

from pathlib import Path


def plot_curve(out: Path, rows: list[dict], base_seed: int) -> None:
    """``curve.png``: gold log-prob and exact match against the label count, a line per learned retriever and
    loss (the pooled row where seeds were pooled, else ``base_seed``'s), a dashed line per reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in (
        (axes[0], "gold_logprob", "gold log-prob (nats, higher is better)"),
        (axes[1], "em", "exact match (%)"),
    ):
        refs = [r for r in rows if r["loss"] is None and r[key] is not None]
        for i, r in enumerate(refs):
            ax.axhline(r[key], ls="--", lw=1, color=f"C{i + 3}", label=r["retriever"])
        lines = sorted({(r["retriever"], r["loss"]) for r in rows if r["loss"]})  # (epr | hybrid, loss)
        for j, (retriever, loss) in enumerate(lines):
            best = {}  # per point: the pooled row where seeds were pooled, else the base seed's
            for r in rows:
                mine = r["retriever"] == retriever and r["loss"] == loss and r[key] is not None
                if mine and (r["seeds"] > 1 or r["seed"] == base_seed):
                    if r["labels"] not in best or r["seeds"] > best[r["labels"]]["seeds"]:
                        best[r["labels"]] = r
            pts = sorted((n, r[key]) for n, r in best.items())
            if pts:
                name = "EPR" if retriever == "epr" else f"{retriever} (EPR + BM25)"
                ax.plot(*zip(*pts), "o-", color=f"C{j}", label=f"{name} ({loss})")
        ax.set(xscale="log", xlabel="LM-labelled training examples", ylabel=label)
        if ax.has_data():
            ax.legend(fontsize=7)
        else:  # e.g. exact match where it was not run (--em none)
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    axes[0].set_title("dense metric, every point")
    axes[1].set_title("exact match, deciding rows")
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=120)
    plt.close(fig)


def gap_series(points: list[dict], datasets: tuple[str, ...]) -> list[tuple[str, str, bool, list[dict]]]:
    """The gap plot's series: (dataset, split, filled, points), one per dataset and split; filled where the split
    is locked (each point's ``locked``: ``locked``, ``dialogue-locked``, ``test``), hollow for dev parts."""
    out = []
    for ds in datasets:
        for split in sorted({p["split"] for p in points if p["dataset"] == ds}):
            pts = [p for p in points if p["dataset"] == ds and p["split"] == split]
            out.append((ds, split, all(p["locked"] for p in pts), pts))
    return out


def plot_gap(points: list[dict], path: Path, datasets: tuple[str, ...]) -> None:
    """Labels (x, log scale) against the share of the oracle gap captured (y), one colour per dataset, filled for
    locked splits, hollow for dev, bars for the paired bootstrap interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = dict(zip(datasets, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for ds, split, filled, pts in gap_series(points, datasets):
        c = colours.get(ds, "gray")
        x = [p["labels"] * (1 + 0.03 * (i % 5 - 2)) for i, p in enumerate(pts)]  # side by side, not on top
        y = [p["gap"] for p in pts]
        err = [[max(0.0, p["gap"] - p["ci"][0]) if p["ci"] else 0.0 for p in pts],
               [max(0.0, p["ci"][1] - p["gap"]) if p["ci"] else 0.0 for p in pts]]  # fmt: skip
        ax.errorbar(x, y, yerr=err, fmt="o", color=c, mfc=c if filled else "white", ms=5, lw=0.8, capsize=2,
                    label=f"{ds} ({split})")  # fmt: skip
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xscale("log")
    ticks = sorted({p["labels"] for p in points})
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("LM-labelled training examples")
    ax.set_ylabel("share of the BM25 -> LM-Oracle gap\n(gold log-prob)")
    ax.set_title("What the labels buy (learned rows; bars: 95% paired bootstrap)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
