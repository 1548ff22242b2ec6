"""PNG figures in the spirit of the paper's: leakage, refusal, IFEval accuracy and kept fraction vs ratio."""
from __future__ import annotations

from pathlib import Path

from . import aggregate as agg

STYLES = {"plain": "-", "whitelist": "--", "fair": ":", "fair+whitelist": "-.", "fair_paper": (0, (5, 1, 1, 1, 1, 1)),
          "fair_boundary": (0, (1, 3))}
KEPT_VARIANTS = ("plain", "fair", "fair_paper", "fair_boundary")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(a, title: str, i: int, j: int, nd: int, ylabel: str) -> None:
    """A panel's title and grid; the x label on the bottom row, the y label on the first column."""
    a.set_title(title, fontsize=9)
    a.grid(True, alpha=0.3)
    if i == nd - 1:
        a.set_xlabel("compression ratio")
    if j == 0:
        a.set_ylabel(ylabel)


def _save(fig, axs, title: str, path: Path, legend_size: int = 7) -> Path:
    axs[0][0].legend(fontsize=legend_size)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _metric_figure(g, ax, key: str, ylabel: str, path: Path, title: str, auto_y: bool = False) -> Path:
    """Rows: defenses; columns: variants; one line per policy. auto_y: the y axis ends just above the
    largest value (small leakage values are unreadable on 0..1)."""
    plt = _plt()
    vals = [c.get(key) for c in g.values() if c.get(key) is not None]
    top = min(1.02, max(0.1, 1.15 * max(vals))) if (auto_y and vals) else 1.02
    nd, nv = len(ax["defense"]), len(ax["variant"])
    fig, axs = plt.subplots(nd, nv, figsize=(max(6.0, 3.4 * nv), 2.8 * nd + 0.4), squeeze=False, sharex=True, sharey=True)
    for i, d in enumerate(ax["defense"]):
        for j, v in enumerate(ax["variant"]):
            a = axs[i][j]
            for p in ax["policy"]:
                pts = [(q, g[(d, p, v, q)].get(key)) for q in ax["ratio"] if (d, p, v, q) in g]
                pts = [(q, y) for q, y in pts if y is not None]
                if pts:
                    a.plot([q for q, _ in pts], [y for _, y in pts], marker="o", ms=3, label=p)
            _label(a, f"{d} defense, {v}", i, j, nd, ylabel)
            a.set_ylim(-0.02 * top, top)
    return _save(fig, axs, title, path)


def _kept_figure(g, ax, path: Path) -> Path:
    """Rows: defenses; columns: policies; defense vs instruction segment, one line style per variant (plain, fair,
    fair_paper, fair_boundary). fair_paper's instruction line is the whole system-prompt span (aggregate.kept_of)."""
    plt = _plt()
    nd, npol = len(ax["defense"]), len(ax["policy"])
    fig, axs = plt.subplots(nd, npol, figsize=(max(6.0, 3.0 * npol), 2.8 * nd + 0.4), squeeze=False, sharex=True, sharey=True)
    colors = {"defense": "tab:red", "instructions": "tab:blue"}
    for i, d in enumerate(ax["defense"]):
        for j, p in enumerate(ax["policy"]):
            a = axs[i][j]
            for v in [v for v in ax["variant"] if v.split(" ")[0] in KEPT_VARIANTS]:
                base = v.split(" ")[0]
                faded = {} if v == base else {"lw": 0.8, "alpha": 0.5}   # other settings, e.g. "fair [sinks 0]"
                for seg in ("defense", "instructions"):
                    pts = [(q, (g[(d, p, v, q)].get("kept") or {}).get(seg)) for q in ax["ratio"]]
                    pts = [(q, y) for q, y in pts if y is not None]
                    if pts:
                        name = "system prompt" if (base, seg) == ("fair_paper", "instructions") else seg
                        a.plot([q for q, _ in pts], [y for _, y in pts], linestyle=STYLES.get(base, "-"),
                               color=colors[seg], marker="o", ms=3, label=f"{name} ({v})", **faded)
            qs = ax["ratio"]
            a.plot(qs, [1 - q for q in qs], color="gray", lw=0.8, alpha=0.6, label="1 − ratio")
            _label(a, f"{p}, {d} defense", i, j, nd, "kept fraction")
            a.set_ylim(-0.02, 1.02)
    return _save(fig, axs, "Kept fraction per segment (fair should follow 1 − ratio for both)", path, legend_size=6)


def _variant_figure(recs: list[dict], ax, key: str, ylabel: str, path: Path, title: str) -> Path:
    """The paper's layout: rows defense orders, columns policies, one line per variant, each point the mean over
    items with its bootstrap 95 % interval as a band (aggregate.cell_ci)."""
    plt = _plt()
    nd, npol = len(ax["defense"]), len(ax["policy"])
    fig, axs = plt.subplots(nd, npol, figsize=(max(6.0, 3.0 * npol), 2.8 * nd + 0.4), squeeze=False, sharex=True,
                            sharey=True)
    for i, d in enumerate(ax["defense"]):
        for j, p in enumerate(ax["policy"]):
            a = axs[i][j]
            for v in ax["variant"]:
                pts = [(q, agg.cell_ci(agg.cell(recs, d, p, v, q), key)) for q in ax["ratio"]]
                pts = [(q, ci) for q, ci in pts if ci is not None]
                if not pts:
                    continue
                qs = [q for q, _ in pts]
                line, = a.plot(qs, [ci[0] for _, ci in pts], linestyle=STYLES.get(v.split(" ")[0], "-"), marker="o",
                               ms=3, label=v)
                a.fill_between(qs, [ci[1] for _, ci in pts], [ci[2] for _, ci in pts], color=line.get_color(),
                               alpha=0.12, lw=0)
            _label(a, f"{p}, {d} defense", i, j, nd, ylabel)
    return _save(fig, axs, title, path)


def write_all(records_all: list[dict], img_dir: Path, prefix: str = "pitfalls_") -> list[Path]:
    """The figures of the metrics the records carry, named <prefix><what>.png."""
    recs = agg.ok_records(records_all)
    if not recs:
        return []
    img_dir.mkdir(parents=True, exist_ok=True)
    ax = agg.axes(recs)
    g = agg.grid(recs)
    have = agg.present(recs)
    out = []
    if "leak_system" in have:
        out += [
            _metric_figure(g, ax, "leak_system", "ROUGE-L recall", img_dir / f"{prefix}leakage.png",
                           "Leakage: ROUGE-L recall of the system prompt in the attack's answer", auto_y=True),
            _variant_figure(recs, ax, "leak_system", "ROUGE-L recall", img_dir / f"{prefix}leakage_variants.png",
                            "Leakage against compression ratio, one line per variant (bands: 95 % CI over items)"),
            _metric_figure(g, ax, "refusal", "refusal rate", img_dir / f"{prefix}refusal.png",
                           "Fraction of attack answers with the defense's refusal"),
            _variant_figure(recs, ax, "refusal", "refusal rate", img_dir / f"{prefix}refusal_variants.png",
                            "Refusal rate against compression ratio, one line per variant (bands: 95 % CI over items)"),
        ]
    if "ifeval_strict" in have:
        out.append(_metric_figure(g, ax, "ifeval_strict", "IFEval accuracy", img_dir / f"{prefix}ifeval.png",
                                  "IFEval instruction-level strict accuracy"))
    out.append(_kept_figure(g, ax, img_dir / f"{prefix}kept_fraction.png"))
    return out
