"""What ``sessrec monitor`` writes and prints: its outputs checked before any work, the table as a file
(``.csv`` or ``.parquet``), as aligned text and as a plot of its metrics over the windows."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sessrec.saved.atomic import atomic_path
from sessrec.scoring.output import same_file


def check_outputs(outputs: dict[str, str | None], paths: list[str], overwrite: bool = False) -> None:
    """Refuse, before anything is read, an output (setting -> file, None: not written) that is one of the event
    files `paths`, the file of another output or a directory: writing it would replace what the run reads or
    writes, or fail once the work is done; and, unless `overwrite`, one that exists.

    Raises:
        FileExistsError: an output exists and `overwrite` is false.
    """
    given = [(name, path) for name, path in outputs.items() if path is not None]
    for i, (name, path) in enumerate(given):
        if Path(path).is_dir():
            raise ValueError(f"monitor: {name} {path} is a directory; name a file in it")
        for events in paths:
            if same_file(path, events):
                raise ValueError(f"monitor: {name} {path} is the event file {events} that the run reads; name another file")
        for other, taken in given[:i]:
            if same_file(path, taken):
                raise ValueError(f"monitor: {name} {path} is the file {other} names; name another file")
        if Path(path).exists() and not overwrite:
            raise FileExistsError(f"monitor: {name} {path} exists; set overwrite true to replace it, or name another file")


def write_table(table: pa.Table, out: str | os.PathLike) -> None:
    with atomic_path(out) as tmp:
        if Path(out).suffix == ".parquet":
            pq.write_table(table, tmp)
        else:
            pacsv.write_csv(table, tmp)


def plot_table(table: pa.Table, k: int, path: str) -> None:
    """Hit rate, MRR, coverage, unknown share and PSI of each version over the windows, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [f"hit_rate@{k}", f"mrr@{k}", f"coverage@{k}", "unknown_share", "psi"]
    fig, axes = plt.subplots(len(columns), 1, figsize=(8, 2.2 * len(columns)), sharex=True)
    for version in pc.unique(table.column("model_version")).to_pylist():
        rows = table.filter(pc.equal(table.column("model_version"), version))
        when = rows.column("window_start").to_numpy(zero_copy_only=False)
        for ax, column in zip(axes, columns, strict=True):
            ax.plot(when, rows.column(column).to_numpy(), marker="o", label=version)
            ax.set_ylabel(column)
    axes[0].legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def format_table(table: pa.Table) -> str:
    """The table as aligned text (one line per version and window; rates with 4 decimals)."""
    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.4f}"
        return f"{value:%Y-%m-%dT%H:%M}Z" if hasattr(value, "strftime") else str(value)

    rows = [table.column_names] + [[cell(v) for v in row.values()] for row in table.to_pylist()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
