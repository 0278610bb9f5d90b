"""Retraining the DLRM click scorer on trivago click-outs every 6 hours, with growing tables and a gate.

The base model (``recipes/dlrm_trivago_daily.yaml``: click-outs before 2018-11-08 00:00 UTC, growing
tables) is warm-started four times, each on the 12 hours before a 4-hour validation period and gated
on the 6 hours after (MRR of the clicked hotel within each click-out's list, tolerance 0.005). The
ranking vocabulary grows by each window's new hotels, cities and filters; each table inserts rows for
the new ids as training meets them, its learned rows untouched. Last, a candidate trained at a
learning rate 100x the recipe's shows the gate rejecting.

    sessrec fit --config recipes/dlrm_trivago_daily.yaml      # the base model, runs/dlrm_trivago_daily/model
    python benchmarks/retrain_dlrm.py                          # JSON: one row per decision
    python benchmarks/retrain_dlrm.py --quick                  # seconds: a synthetic log, a tiny base model

``--quick`` (for CI) needs neither the trivago log nor the base model: a synthetic log in trivago's format
(2,400 sessions over 2018-11-07 .. 11-08, each ending in a click-out on 12 impressions) in a temporary
folder, a tiny DLRM (width 8) trained 1 epoch on its click-outs before 2018-11-07 18:00 as the base,
1 epoch per candidate, the gate's minimum test size 100; the same windows and turns.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import tempfile
from pathlib import Path

import torch

from sessrec.lifecycle.gate import Gate
from sessrec.lifecycle.retrain import retrain_dlrm

LOG = "../shared/data/trivago_rsc19_100k/trivago_val_100k.parquet.snappy"
ENDS = ["2018-11-08T06:00", "2018-11-08T12:00", "2018-11-08T18:00", "2018-11-09T00:00"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="runs/dlrm_trivago_daily/model")
    parser.add_argument("--path", default=LOG)
    parser.add_argument("--work", default="runs/dlrm_trivago_daily/benchmark", help="scratch folder (replaced)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="seconds, for CI: a synthetic log and a tiny base model in a temporary folder, 1 epoch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gate = Gate("mrr", 0.005)
    if args.quick:
        tmp = Path(tempfile.mkdtemp(prefix="retrain_dlrm_quick_"))
        atexit.register(shutil.rmtree, tmp, True)
        args.path, args.base, args.work, args.epochs = quick_log(tmp / "log.parquet"), str(tmp / "base"), str(tmp / "benchmark"), 1
        gate = Gate("mrr", 0.005, min_pairs=100)
        quick_base(args.path, args.base)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    current = work / "model"
    shutil.copytree(args.base, current)
    common = dict(path=args.path, test_hours=6.0, valid_hours=4.0, train_hours=12.0, gate=gate,
                  max_epochs=args.epochs)
    rows = [summary("warm start", retrain_dlrm(str(current), end=end, out=str(work / f"window-{i}"), **common))
            for i, end in enumerate(ENDS)]
    bad = retrain_dlrm(str(current), end=ENDS[-1], out=str(work / "too-high-lr"), lr=0.1, backfill=True,  # the last window again
                       **common)
    rows.append(summary("warm start, lr 0.1", bad))
    quick = {"quick": True, "path": "synthetic", "min_pairs": gate.min_pairs} if args.quick else {}
    print(json.dumps({"benchmark": "retrain_dlrm", "epochs": args.epochs, **quick, "rows": rows}, indent=1))


def quick_log(path: Path, sessions: int = 2400, seed: int = 0) -> str:
    """``--quick``: a trivago-format log of `sessions` sessions spread over the two days from 2018-11-07 00:00 UTC:
    a destination search, image views of hotels of its city (4 cities at first, 12 at the end: each window
    meets new hotels), a filter in every other session, and a click-out on the first hotel viewed among the
    city's 12 hotels shown."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    columns = ("user_id", "session_id", "timestamp", "step", "action_type", "reference", "platform", "city", "device",
               "current_filters", "impressions", "prices")
    rows: dict[str, list] = {c: [] for c in columns}
    for s in range(sessions):
        city = int(rng.integers(0, 4 + 8 * s // sessions))  # cities 4..11 open over time: new hotels in later windows
        hotels = 1000 + city * 12 + rng.integers(0, 12, size=int(rng.integers(2, 6)))
        events = [("search for destination", f"City {city}, X")]
        events += [("interaction item image", str(h)) for h in hotels[:-1]]
        if s % 2:
            events.append(("filter selection", "4 Star"))
        events.append(("clickout item", str(hotels[0])))
        t = 1_541_548_800 + int(s * 2 * 86_400 / sessions)
        shown = "|".join(str(1000 + city * 12 + k) for k in rng.permutation(12))
        for step, (action, ref) in enumerate(events, start=1):
            t += int(rng.integers(1, 90))
            click = action == "clickout item"
            values = (f"u{s % 300}", f"s{s:05d}", t, step, action, ref, ["DE", "US", "BR"][s % 3], f"City {city}, X",
                      ["mobile", "desktop"][s % 2], "4 Star" if s % 2 and step > 2 else None, shown if click else None,
                      "|".join(str(50 + 10 * k) for k in range(12)) if click else None)
            for c, v in zip(columns, values):
                rows[c].append(v)
    pq.write_table(pa.table(rows), path)
    return str(path)


def quick_base(path: str, out: str) -> None:
    """``--quick``: the base model, a tiny DLRM with growing tables trained 1 epoch on the 6 hours of click-outs
    before the 4-hour validation and 6-hour test periods that end at 2018-11-07 18:00."""
    import pytorch_lightning as pl

    from sessrec.embeddings import DynamicTables
    from sessrec.tasks import DLRMTask
    from sessrec.tasks.clickout_data import ClickoutDataModule

    data = ClickoutDataModule(path, end="2018-11-07T18:00", batch_size=4096, test_hours=6.0, valid_hours=4.0,
                              train_hours=6.0, min_count=1)
    pl.seed_everything(0)
    base = DLRMTask(cardinalities=data.cardinalities, num_dense=data.num_dense,
                    network={"embedding_dim": 8, "dense_layers": [16, 8], "over_layers": [16]}, sparse=DynamicTables(lr=0.05))
    pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(base, datamodule=data)
    ranker = base.ranker()
    ranker.train_end = data.train_end()  # as sessrec fit records it: no turn goes back before it
    ranker.save_pretrained(out)


def summary(kind: str, d: dict) -> dict:
    return {
        "run": kind, "window_end": d["window_end"], "train_rows": d["train_rows"], "test_rows": d["test_rows"],
        "hotel_ids": [d["current_ids"]["hotel"], d["candidate_ids"]["hotel"]],
        "hotel_rows_in_table": d["rows_in_tables"]["hotel"],
        "current_mrr": round(d["metrics"]["current"]["mrr"], 4), "candidate_mrr": round(d["metrics"]["candidate"]["mrr"], 4),
        "best_mrr": round(d["metrics"]["best"]["mrr"], 4) if "best" in d["metrics"] else None,
        "candidate_auc": round(d["metrics"]["candidate"]["auc"], 4), "clickouts": d["pairs"],
        "train_seconds": d["train_seconds"], "promoted": d["promoted"], "version": d.get("version"), "best": d["best"],
        "reason": d["reason"],
    }


if __name__ == "__main__":
    main()
