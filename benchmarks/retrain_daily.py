"""Daily incremental retraining on rsc15_100k: warm start against training from scratch, and the gate.

The base model (``recipes/xlnet_mlm_rsc15_daily.yaml``: 2014-04-01 .. 04-03) is retrained one day at a
time with ``recipes/retrain_rsc15.yaml`` (warm start, 10 epochs on the new day and the two before it,
lr 0.003) and gated on the day after; each day, the same architecture is also trained from scratch on every day so far (the base
recipe's 10 epochs, lr 0.003, warm-up 100), as a shadow run that is never promoted. Last, a warm
start with a learning rate 50x too high shows the gate rejecting a candidate.

    sessrec fit --config recipes/xlnet_mlm_rsc15_daily.yaml      # the base model, runs/rsc15_daily/model
    python benchmarks/retrain_daily.py                            # JSON: one row per decision
    python benchmarks/retrain_daily.py --quick                    # seconds: synthetic days, untrained tiny base

``--quick`` (for CI) needs neither the dataset nor the base model: synthetic sessions (3,000 over
2014-04-01 .. 04-09) in a temporary folder, an untrained tiny XLNet (d_model 16, one layer) on their
first three days as the base, every run 1 epoch, the gate's minimum test size 50; the same turns.

Timings are wall seconds of training alone (evaluation excluded) on this machine, 1 torch thread.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import tempfile
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import torch
import yaml

from sessrec.data import Schema
from sessrec.lifecycle.gate import Gate
from sessrec.lifecycle.retrain import retrain

DAYS = ["2014-04-04", "2014-04-05", "2014-04-06", "2014-04-07", "2014-04-08"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="runs/rsc15_daily/model", help="the base model directory (sessrec fit)")
    parser.add_argument("--recipe", default="recipes/retrain_rsc15.yaml")
    parser.add_argument("--work", default="runs/rsc15_daily/benchmark", help="scratch folder (replaced)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--replay_days", type=int, default=2, help="warm starts also train on this many days before the new one")
    parser.add_argument("--epochs", type=int, default=None, help="warm-start epochs (default: the recipe's)")
    parser.add_argument("--lr", type=float, default=None, help="warm-start learning rate (default: the recipe's)")
    parser.add_argument("--skip_scratch", action="store_true", help="only the warm starts and the rejection")
    parser.add_argument("--quick", action="store_true",
                        help="seconds, for CI: synthetic days and an untrained tiny base model in a temporary folder, 1 epoch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = yaml.safe_load(Path(args.recipe).read_text())
    scratch_epochs = 10
    if args.quick:
        work = Path(tempfile.mkdtemp(prefix="retrain_daily_quick_"))
        atexit.register(shutil.rmtree, work, True)
        args.work, args.base = str(work / "benchmark"), str(work / "base")
        recipe = {**recipe, "paths": [quick_events(work / "events.parquet")], "schema": {},
                  "gate": {**recipe["gate"], "min_pairs": 50}, "max_epochs": 1}
        quick_base(recipe["paths"], args.base)
        scratch_epochs = 1
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    current = work / "model"
    shutil.copytree(args.base, current)
    common = dict(paths=recipe["paths"], schema=Schema(**recipe["schema"]), gate=Gate(**recipe["gate"]),
                  batch_size=recipe["batch_size"])
    rows = []
    epochs, lr = args.epochs or recipe["max_epochs"], args.lr or recipe["lr"]
    for day, next_day, after in zip(DAYS, DAYS[1:], DAYS[2:]):
        start = (date.fromisoformat(day) - timedelta(days=args.replay_days)).isoformat()
        warm = retrain(str(current), train_from=start, train_until=next_day, test_until=after, out=str(work / f"warm-{day}"),
                       warm_start=True, max_epochs=epochs, lr=lr, warmup_steps=recipe["warmup_steps"], **common)
        rows.append(summary("warm start", warm))
        if args.skip_scratch:
            continue
        scratch = retrain(str(current), train_from="2014-04-01", train_until=next_day, test_until=after,
                          out=str(work / f"scratch-{day}"), warm_start=False, max_epochs=scratch_epochs, lr=0.003, warmup_steps=100,
                          promote=False, **common)
        rows.append(summary("from scratch (shadow)", scratch))
    start = (date.fromisoformat(DAYS[2]) - timedelta(days=args.replay_days)).isoformat()
    bad = retrain(str(current), train_from=start, train_until=DAYS[3], test_until=DAYS[4], out=str(work / "too-high-lr"),
                  warm_start=True, max_epochs=epochs, lr=0.05, warmup_steps=0, backfill=True, **common)  # the last window again
    rows.append(summary("warm start, lr 0.05", bad))
    settings = {"replay_days": args.replay_days, "warm_epochs": epochs, "warm_lr": lr, "threads": args.threads,
                **({"quick": True, "scratch_epochs": scratch_epochs, "min_pairs": recipe["gate"]["min_pairs"]} if args.quick else {})}
    log = str(current / "promotions.jsonl")
    print(json.dumps({"benchmark": "retrain_daily", "settings": settings, "log": log, "rows": rows}, indent=1))


def quick_events(path: Path) -> str:
    """``--quick``: 3,000 synthetic sessions (100 items) over the 8 days from 2014-04-01 00:00 UTC, product views
    only, as a parquet event file with the default schema's columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from sessrec.data import generate_sessions

    events = generate_sessions(num_sessions=3000, num_items=100, days=8, seed=0)
    events = events.filter(pc.equal(events.column("event_type"), "product"))  # page views carry no item
    t = events.column("timestamp").to_numpy()
    start = datetime(2014, 4, 1, tzinfo=timezone.utc).timestamp()
    events = events.set_column(events.schema.get_field_index("timestamp"), "timestamp", pa.array(t - np.min(t) + start))
    pq.write_table(events.select(["session_id", "item_id", "timestamp"]), path)
    return str(path)


def quick_base(paths: list[str], out: str) -> None:
    """``--quick``: the base model, an untrained tiny XLNet-MLM whose catalogue is the first three days'."""
    from sessrec.data import TimeWindowSource
    from sessrec.models import XLNetEncoder
    from sessrec.tasks import NextItemTask, SessionDataModule

    dm = SessionDataModule(TimeWindowSource(paths, Schema(), "2014-04-01", "2014-04-03", "2014-04-04"), max_length=8)
    torch.manual_seed(0)
    task = NextItemTask(num_items=dm.num_items, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1))
    task.vocab = dm.vocab
    recommender = task.recommender()
    recommender.train_end = dm.splits.train_end()  # as sessrec fit records it: no turn goes back before it
    recommender.save_pretrained(out)


def summary(kind: str, decision: dict) -> dict:
    metric = decision["gate"]["metric"]
    return {
        "run": kind, "train_window": decision["train_window"], "test_window": decision["test_window"],
        "train_sessions": decision["train_sessions"], "test_sessions": decision["test_sessions"],
        "items": decision["candidate_items"], "new_items": decision["new_items"],
        f"current_{metric}": round(decision["metrics"]["current"][metric], 4),
        f"candidate_{metric}": round(decision["metrics"]["candidate"][metric], 4),
        f"best_{metric}": round(decision["metrics"]["best"][metric], 4) if "best" in decision["metrics"] else None,
        "candidate_mrr@20": round(decision["metrics"]["candidate"]["mrr@20"], 4),
        "pairs": decision["pairs"], "train_seconds": decision["train_seconds"], "passed": decision["passed"],
        "promoted": decision["promoted"], "version": decision.get("version"), "best": decision["best"],
        "reason": decision["reason"],
    }


if __name__ == "__main__":
    main()
