"""The figures of docs/results.md and docs/benchmarks.md, drawn from the JSON the benchmarks print.

Reads every ``*.json`` in ``--data`` (default ``docs/figures/data``): each file is
``{"machine": ..., "runs": [{"command": ..., "lines": [...]}]}``, where ``lines`` are the JSON lines
the command prints (``benchmarks/*.py``) or, for ``sessrec test``, its test metrics
(``test/recall@20``, ...) with the recipe and the wall time of ``sessrec fit``. Writes into ``--out``
(default ``docs/figures``):

- ``accuracy_vs_time.png``: each dataset's headline metric against training time (log axis), one
  point per model (``models.json``; baselines, which train nothing, at the time to fit and rank;
  the pipeline of ``pipeline_eval.json`` as a dashed line);
- ``pipeline_stages.png``: Recall@20 and MRR@20 after each stage of the pipeline, per dataset;
- ``pipeline_ablations.png``: what removing one retriever or one feature group costs;
- ``throughput_ratios.png``: the speed ratios of ``docs/benchmarks.md`` (loader, sampled softmax,
  embedding core, DLRM, ANN index, torch.compile, and the training step against a peer library
  when ``train_throughput.json`` holds a line with ``ratio``).

The output is deterministic: Agg backend, matplotlib's default style, fixed size and dpi, no
timestamp or software tag in the PNG metadata.

    python benchmarks/plots.py                      # docs/figures/data/*.json -> docs/figures/*.png
    python benchmarks/plots.py --data DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker

ROOT = Path(__file__).resolve().parent.parent
DPI = 100
# figure name -> size in inches (at DPI: the PNG is 100x these in pixels)
SIZES = {
    "accuracy_vs_time.png": (16.0, 11.5),
    "pipeline_stages.png": (13.0, 12.0),
    "pipeline_ablations.png": (13.0, 6.0),
    "throughput_ratios.png": (16.0, 9.0),
}

DATASETS = {  # key in the JSON -> panel title
    "diginetica": "DIGINETICA (SR-GNN split, every prefix)",
    "yoochoose164": "YOOCHOOSE 1/64 (SR-GNN split)",
    "rsc15_100k": "rsc15_100k (last item)",
    "trivago": "trivago_rsc19_100k (last product)",
    "tmall": "Tmall (GCE-GNN split)",
    "nowplaying": "Nowplaying (GCE-GNN split)",
    "amazon_beauty": "Amazon Beauty (leave-one-out)",
    "s3rec_beauty": "S3-Rec Beauty (leave-one-out)",
    "s3rec_sports": "S3-Rec Sports (leave-one-out)",
    "s3rec_toys": "S3-Rec Toys (leave-one-out)",
    "s3rec_yelp": "S3-Rec Yelp (leave-one-out)",
}
METRIC_LABELS = {"test/recall@20": "Recall@20", "test/recall@10": "HR@10 (= Recall@10)"}


def load(data_dir: Path) -> dict[str, dict]:
    """Every JSON file of `data_dir`, by file stem."""
    files = sorted(Path(data_dir).glob("*.json"))
    if not files:
        raise SystemExit(f"no *.json in {data_dir}")
    return {f.stem: json.loads(f.read_text()) for f in files}


def lines(data: dict, name: str, per_seed: bool = False) -> list[dict]:
    """All result lines of one data file (empty when the file is absent).

    A run over several seeds (``pipeline_eval.py --seeds N``) prints each seed's lines, then one
    line per system with their means (marked by ``seeds``): of such a run, only the means and the
    ablations are returned, unless `per_seed`.
    """
    out = []
    for run in data.get(name, {}).get("runs", []):
        out += run_lines(run, per_seed)
    return out


def run_lines(run: dict, per_seed: bool = False) -> list[dict]:
    """The result lines of one run, as `lines` returns them."""
    means = any("seeds" in line for line in run["lines"])
    return [line for line in run["lines"]
            if per_seed or not means or "seeds" in line or line["system"].startswith("pipeline-without-")]


# ------------------------------------------------------------------ series: what each figure draws
def accuracy_series(data: dict) -> dict[str, dict]:
    """Per dataset: the metric's key, [(model, seconds, value, trained, device)] (every model but the
    popularity baseline, a floor far below the rest; device None for this CPU, else the GPU that trained
    it), and the pipeline's Recall@20."""
    models = data["models"]
    out: dict[str, dict] = {}
    for line in lines(data, "models"):
        if line["model"] == "popularity":
            continue  # a floor far below the rest: it stays in the tables, not in the figure
        ds = line["dataset"]
        metric = models["metric"][ds]
        panel = out.setdefault(ds, {"metric": metric, "points": [], "pipeline": None})
        trained = "train_seconds" in line
        seconds = line["train_seconds"] if trained else line["wall_seconds"]
        panel["points"].append((line["model"], float(seconds), float(line[metric]), trained, line.get("device")))
    for line in lines(data, "pipeline_eval"):
        if line["system"] == "pipeline" and line["dataset"] in out:
            out[line["dataset"]]["pipeline"] = float(line["recall@20"])
    return {ds: out[ds] for ds in DATASETS if ds in out}


STAGES = (
    "best retriever alone",
    "candidate recall (ceiling)",
    "ranked by the DLRM",
    "ranked by LightGBM",
    "served list (the recipe's ranker, ordered)",
)


def stage_series(data: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Per dataset, per metric (recall@20, mrr@20): the value after each pipeline stage."""
    by_ds: dict[str, list[dict]] = {}  # each dataset's latest run with a pipeline line
    for run in data.get("pipeline_eval", {}).get("runs", []):
        found = run_lines(run)
        for ds in {line["dataset"] for line in found if line["system"] == "pipeline"}:
            by_ds[ds] = [line for line in found if line["dataset"] == ds]
    out = {}
    for ds, rows in by_ds.items():
        systems = {r["system"]: r for r in rows}
        retrievers = [r for r in rows if "retrieval_recall@50" in r]
        stages: dict[str, dict[str, float]] = {}
        for metric in ("recall@20", "mrr@20"):
            best = max(retrievers, key=lambda r: r[metric])
            values = {f"{STAGES[0]} ({best['system']})": best[metric]}
            if metric == "recall@20":
                values[STAGES[1]] = systems["pipeline"]["candidate_recall"]
            values[STAGES[2]] = systems["pipeline-dlrm"][metric]
            values[STAGES[3]] = systems["pipeline-gbdt"][metric]
            values[STAGES[4]] = systems["pipeline"][metric]
            stages[metric] = {k: float(v) for k, v in values.items()}
        out[ds] = stages
    return out


def ablation_series(data: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Per metric, per ablation ("retriever-xlnet", ...), per dataset: the change against the full
    pipeline with the same ranker (LightGBM) and the same seeds, rounded as the docs print it."""
    out: dict[str, dict[str, dict[str, float]]] = {"recall@20": {}, "mrr@20": {}}
    key = lambda r: (r["dataset"], r.get("stage1_seed"), r.get("ranker_seed"))
    for run in data.get("pipeline_eval", {}).get("runs", []):  # an ablation against the full pipeline of its own run
        rows = run_lines(run, per_seed=True)
        full = {key(r): r for r in rows if r["system"] == "pipeline-gbdt"}
        for r in rows:
            if not r["system"].startswith("pipeline-without-"):
                continue
            name = r["system"].removeprefix("pipeline-without-")
            for metric, by_name in out.items():
                delta = round(r[metric] - full[key(r)][metric], 4)
                by_name.setdefault(name, {})[r["dataset"]] = delta + 0.0  # no -0.0
    return out


def ratio_series(data: dict) -> list[tuple[str, str, list[tuple[str, float]]]]:
    """Panels of (title, x label, [(bar label, ratio)])."""
    panels = []
    loader = [(f"batch {r['batch_size']}", float(r["ratio"])) for r in lines(data, "loader")]
    if loader:
        panels.append(("SessionLoader vs a per-item Dataset", "sessions/s ratio", loader))
    soft = []
    for r in lines(data, "sampled_softmax"):
        if r["loss"] == "full_softmax":
            continue
        where = f"{r['encoder']}, V={r['items']:,}, B={r['batch_size']}"
        soft.append((f"{r['loss'].replace('_', ' ')} ({where})", float(r["speedup_vs_full"])))
    if soft:
        panels.append(("Sampled softmax vs the full softmax", "training-step speed-up", soft))
    emb = []
    for r in lines(data, "embedding"):
        if r["pass"] == "padding":
            continue
        what = f"{r['hot']}-hot " + ("forward" if r["pass"] == "forward" else f"step, {r['optimizer']}")
        emb.append((f"{what}: vs separate", float(r["fused_speedup_vs_separate"])))
        vs_torchrec = r.get("fused_speedup_vs_torchrec", r.get("fused_speedup_vs_torchrec_fused"))
        if vs_torchrec is not None:
            emb.append((f"{what}: vs TorchRec", float(vs_torchrec)))
    if emb:
        panels.append(("Embedding core: fused vs separate bags, TorchRec", "speed-up", emb))
    dlrm = [
        (r["variant"].replace("_", " "), float(r["vs_torchrec"]))
        for r in lines(data, "dlrm")
        if not r["variant"].startswith("torchrec")
    ]
    if dlrm:
        panels.append(("DLRM training step vs TorchRec's DLRM", "samples/s ratio", dlrm))
    ann = [
        (f"{r['system']} (recall@{r['k']} {r['recall@k']})", float(r["speedup"]))
        for r in lines(data, "ann_index")
    ]
    if ann:
        panels.append(("FAISS index vs exact top-200, 1M items", "speed-up per query", ann))
    comp = [(f"{r['encoder']}", float(r["eager_over_compiled"])) for r in lines(data, "compile_speed")]
    if comp:
        panels.append(("torch.compile of the encoder", "eager / compiled step time", comp))
    peer = [(f"vs {r['peer']}", float(r["ratio"])) for r in lines(data, "train_throughput") if "ratio" in r]
    if peer:
        panels.append(("Training step: sessrec against a peer library", "sessions/s ratio", peer))
    return panels


def plotted_values(data: dict) -> dict[str, list[tuple[str, float]]]:
    """Every number each figure draws, labelled (what tests/test_plots.py checks against the docs)."""
    acc = accuracy_series(data)
    out = {name: [] for name in SIZES}
    for ds, panel in acc.items():
        out["accuracy_vs_time.png"] += [(f"{ds} {m}", v) for m, _, v, *_ in panel["points"]]
        if panel["pipeline"] is not None:
            out["accuracy_vs_time.png"].append((f"{ds} pipeline", panel["pipeline"]))
    for ds, metrics in stage_series(data).items():
        for metric, values in metrics.items():
            out["pipeline_stages.png"] += [(f"{ds} {metric} {k}", v) for k, v in values.items()]
    for metric, by_name in ablation_series(data).items():
        for name, per_ds in by_name.items():
            out["pipeline_ablations.png"] += [
                (f"{ds} {metric} without {name}", v) for ds, v in per_ds.items()
            ]
    for title, _, bars in ratio_series(data):
        out["throughput_ratios.png"] += [(f"{title}: {label}", v) for label, v in bars]
    return out


# ------------------------------------------------------------------ drawing
def _figure(name: str):
    return plt.figure(figsize=SIZES[name], dpi=DPI, layout="constrained")


STYLE = {  # model -> (colour, marker); baselines are squares, a model's variants share its colour
    "V-SKNN": ("black", "s"),
    "STAN": ("#969696", "s"),
    "GRU4Rec": ("#ff7f0e", "o"),
    "SASRec": ("#2ca02c", "o"),
    "GPT-2 CLM": ("#17becf", "o"),
    "GPT-2, full softmax": ("#17becf", "^"),
    "HSTU": ("#393b79", "o"),
    "HSTU, full softmax": ("#393b79", "^"),
    "BERT MLM": ("#d62728", "o"),
    "ELECTRA RTD": ("#e377c2", "o"),
    "XLNet PLM": ("#9467bd", "o"),
    "XLNet MLM": ("#1f77b4", "o"),
    "XLNet MLM, sampled softmax": ("#1f77b4", "v"),
    "XLNet MLM + side info": ("#1f77b4", "D"),
    "XLNet MLM + virtual items": ("#1f77b4", "P"),
    "XLNet MLM + reversal": ("#1f77b4", "*"),
}


def draw_accuracy(data: dict, path: Path) -> None:
    series = accuracy_series(data)
    names: list[str] = []
    for panel in series.values():
        names += [m for m, *_ in panel["points"] if m not in names]
    spare = iter(plt.get_cmap("tab20b").colors)
    style = {m: STYLE.get(m) or (next(spare), "o") for m in names}
    every = [s for panel in series.values() for _, s, *_ in panel["points"]]
    fig = _figure(path.name)
    axes = fig.subplots(-(-(len(series) + 1) // 4), 4).ravel()  # a panel per dataset, then the legend
    for ax, (ds, panel) in zip(axes, series.items()):
        points = panel["points"]
        for model, seconds, value, _, device in points:
            colour, marker = style[model]
            ax.scatter(
                [seconds],
                [value],
                s=70 if marker == "*" else 46,
                facecolors="none" if device else colour,  # hollow: trained on a GPU
                marker=marker,
                edgecolors=colour if device else "black",
                linewidths=1.5 if device else 0.5,
                zorder=3,
            )
        values = [v for _, _, v, *_ in points]
        if panel["pipeline"] is not None:
            values.append(panel["pipeline"])
            ax.axhline(panel["pipeline"], color="black", linestyle="--", linewidth=1)
            ax.annotate(
                f"pipeline {panel['pipeline']:.4f}",
                (0.02, panel["pipeline"]),
                xycoords=("axes fraction", "data"),
                xytext=(0, 3),
                textcoords="offset points",
                fontsize=8,
            )
        span = max(values) - min(values) or max(values) * 0.1
        ax.set_ylim(min(values) - 0.12 * span, max(values) + 0.18 * span)
        ax.set_xscale("log")
        ax.set_xlim(min(every) / 1.6, max(every) * 1.6)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(DATASETS[ds], fontsize=10)
        ax.set_ylabel(METRIC_LABELS[panel["metric"]], fontsize=9)
        ax.set_xlabel("seconds (log)", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(labelsize=8)
    legend_ax = axes[len(series)] if len(series) < len(axes) else None
    for ax in axes[len(series) :]:
        ax.axis("off")
    handles = [
        plt.Line2D(
            [],
            [],
            marker=style[m][1],
            linestyle="",
            color=style[m][0],
            markeredgecolor="black",
            markersize=9 if style[m][1] == "*" else 7,
            label=m,
        )
        for m in names
    ]
    handles.append(plt.Line2D([], [], color="black", linestyle="--", label="pipeline (its recipe's ranker)"))
    gpus = sorted({d for panel in series.values() for *_, d in panel["points"] if d})
    handles += [
        plt.Line2D([], [], marker="o", linestyle="", markerfacecolor="none", markeredgecolor="black", markersize=7,
                   label=f"hollow: trained on an {gpu} (its wall time)")
        for gpu in gpus
    ]
    (legend_ax or fig).legend(
        handles=handles,
        loc="center",
        fontsize=9,
        frameon=False,
        title="x: wall time of sessrec fit;\nbaselines (squares): fit and rank",
    )
    fig.suptitle(
        "Test accuracy against training time (full catalogue; 2-core CPU, 1 thread unless stated)",
        fontsize=12,
    )
    _save(fig, path)


def draw_stages(data: dict, path: Path) -> None:
    series = stage_series(data)
    fig = _figure(path.name)
    order = [ds for ds in DATASETS if ds in series]
    per_band = 3  # datasets side by side; each takes two rows (Recall@20 above MRR@20)
    bands = -(-len(order) // per_band)
    axes = fig.subplots(2 * bands, per_band, squeeze=False)
    for empty in range(len(order), bands * per_band):
        band, col = divmod(empty, per_band)
        axes[2 * band][col].set_visible(False)
        axes[2 * band + 1][col].set_visible(False)
    colours = dict(zip(STAGES, ["#9ecae1", "#d9d9d9", "#3182bd", "#6baed6", "#08519c"]))
    for i, ds in enumerate(order):
        band, col = divmod(i, per_band)
        for row, metric in enumerate(("recall@20", "mrr@20")):
            ax = axes[2 * band + row][col]
            values = series[ds][metric]
            labels = list(values)
            bars = ax.bar(
                range(len(labels)),
                list(values.values()),
                color=[colours[next(s for s in STAGES if k.startswith(s))] for k in labels],
                edgecolor="black",
                linewidth=0.5,
            )
            for bar, v in zip(bars, values.values()):
                ax.annotate(
                    f"{v:.4f}",
                    (bar.get_x() + bar.get_width() / 2, v),
                    ha="center",
                    va="bottom",
                    fontsize=6,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
            ax.set_xticks(range(len(labels)), [textwrap.fill(k, 24) for k in labels], fontsize=7, rotation=35, ha="right")
            ax.set_ylim(0, max(values.values()) * 1.18)
            ax.set_ylabel(metric.replace("recall", "Recall").replace("mrr", "MRR"), fontsize=9)
            ax.tick_params(axis="y", labelsize=8)
            if row == 0:
                ax.set_title(DATASETS[ds], fontsize=10)
    fig.suptitle(
        "The pipeline, stage by stage: retrieval (+ filtering) -> scoring -> ordering (test split)",
        fontsize=12,
    )
    _save(fig, path)


def draw_ablations(data: dict, path: Path) -> None:
    series = ablation_series(data)
    fig = _figure(path.name)
    axes = fig.subplots(1, 2, sharey=True)
    datasets = [ds for ds in DATASETS if any(ds in v for m in series.values() for v in m.values())]
    names = sorted(series["recall@20"], key=lambda n: (not n.startswith("retriever"), n))
    height = 0.8 / max(len(datasets), 1)
    cmap = plt.get_cmap("tab10")
    for ax, metric in zip(axes, ("recall@20", "mrr@20")):
        for j, ds in enumerate(datasets):
            ys = [i + (j - (len(datasets) - 1) / 2) * height for i in range(len(names))]
            xs = [series[metric][n].get(ds, math.nan) for n in names]
            ax.barh(ys, xs, height=height, color=cmap(j), label=DATASETS[ds].split(" (")[0])
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(names)), [f"without {n}" for n in names], fontsize=8)
        ax.set_xlabel(
            f"change in {metric.replace('recall', 'Recall').replace('mrr', 'MRR')} (LightGBM ranker)",
            fontsize=9,
        )
        ax.grid(True, axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].invert_yaxis()  # shared: once for both
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=len(datasets),
        fontsize=9,
        frameon=False,
    )
    fig.suptitle(
        "Pipeline ablations: one retriever or one feature group removed (empty: not run)", fontsize=12
    )
    _save(fig, path)


def _times(value: float, _pos=None) -> str:
    return f"{value:g}x"


def draw_ratios(data: dict, path: Path) -> None:
    panels = ratio_series(data)
    fig = _figure(path.name)
    cols = 2 if len(panels) <= 4 else 3 if len(panels) <= 9 else 4
    rows = math.ceil(len(panels) / cols)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (title, xlabel, bars) in zip(axes, panels):
        labels = [b[0] for b in bars]
        values = [b[1] for b in bars]
        colours = ["#bdbdbd" if 0.95 <= v <= 1.05 else "#31a354" if v > 1 else "#de2d26" for v in values]
        ax.barh(range(len(bars)), values, height=0.7, color=colours, edgecolor="black", linewidth=0.5)
        for i, v in enumerate(values):
            ax.annotate(f"{v}x", (v, i), va="center", fontsize=7, xytext=(3, 0), textcoords="offset points")
        ax.set_xscale("log")
        lo, hi = min(values + [1.0]) / 1.5, max(values + [1.0]) * 2.5
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(
            matplotlib.ticker.FixedLocator(
                [t for t in (0.25, 0.5, 1, 2, 5, 10, 20, 50, 100) if lo <= t <= hi]
            )
        )
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_times))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(bars)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"{xlabel} (log scale)", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    for ax in axes[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        "Speed ratios on the 2-core CPU, 1 thread (both sides in one process, interleaved; "
        "green: sessrec or the option is faster)",
        fontsize=12,
    )
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)


DRAW = {
    "accuracy_vs_time.png": draw_accuracy,
    "pipeline_stages.png": draw_stages,
    "pipeline_ablations.png": draw_ablations,
    "throughput_ratios.png": draw_ratios,
}


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT / "docs" / "figures" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    args = parser.parse_args(argv)
    data = load(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    with plt.style.context("default"):  # matplotlib's defaults, whatever a matplotlibrc says
        for name, draw in DRAW.items():
            draw(data, args.out / name)
            written.append(args.out / name)
            print(args.out / name)
    return written


if __name__ == "__main__":
    main()
