"""Retraining the DLRM click scorer on trivago click-outs every 6 hours, with growing tables and a gate.

The base model (``recipes/dlrm_trivago_daily.yaml``: click-outs before 2018-11-08 00:00 UTC, growing
tables) is warm-started four times, each on the 12 hours before a 4-hour validation period and gated
on the 6 hours after (MRR of the clicked hotel within each click-out's list, tolerance 0.005). The
ranking vocabulary grows by each window's new hotels, cities and filters; each table inserts rows for
the new ids as training meets them, its learned rows untouched. Last, a candidate trained at a
learning rate 100x the recipe's shows the gate rejecting.

    sessrec fit --config recipes/dlrm_trivago_daily.yaml      # the base model, runs/dlrm_trivago_daily/model
    python benchmarks/retrain_dlrm.py                          # JSON: one row per decision
"""

from __future__ import annotations

import argparse
import json
import shutil
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    current = work / "model"
    shutil.copytree(args.base, current)
    common = dict(path=args.path, test_hours=6.0, valid_hours=4.0, train_hours=12.0, gate=Gate("mrr", 0.005),
                  max_epochs=args.epochs)
    rows = [summary("warm start", retrain_dlrm(str(current), end=end, out=str(work / f"window-{i}"), **common))
            for i, end in enumerate(ENDS)]
    bad = retrain_dlrm(str(current), end=ENDS[-1], out=str(work / "too-high-lr"), lr=0.1, **common)
    rows.append(summary("warm start, lr 0.1", bad))
    print(json.dumps({"benchmark": "retrain_dlrm", "epochs": args.epochs, "rows": rows}, indent=1))


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
