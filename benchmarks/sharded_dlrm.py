"""The trivago DLRM trained by 1 process and with its tables sharded by TorchRec over 2: the same curve.

Runs ``recipes/dlrm_trivago.yaml`` twice with the tables updated by the dense optimizer:

- 1 process, the embedding core's tables (``FusedTables`` with ``optimizer: none``), batch 4096;
- 2 processes (gloo), ``recipes/overlays/torchrec_cpu.yaml``: TorchRec tables sharded by
  `TorchRecStrategy`, 2048 rows per process (the same global batch of the same rows);

then ``sessrec test`` on the model directory of each (its best checkpoint's), and prints one JSON line: the training loss of every
step of both (logged as the mean over all processes' rows), their largest difference, validation
MRR per epoch, test MRR and wall time. Needs the torchrec extra (docs/sharding.md).

    python benchmarks/sharded_dlrm.py
    python benchmarks/sharded_dlrm.py --quick   # smoke size: 1 epoch of 3 training batches, 1 validation batch
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT.parent / "shared" / "data" / "trivago_rsc19_100k" / "trivago_val_100k.parquet.snappy"
RECIPE = str(ROOT / "recipes" / "dlrm_trivago.yaml")
RUNS = {
    "one_process": ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--model.init_args.sparse.init_args.optimizer", "none"],
    "two_processes_sharded": ["--config", str(ROOT / "recipes" / "overlays" / "torchrec_cpu.yaml"),
                              "--data.init_args.batch_size", "2048"],  # the overlay's TorchRecTables
}


def curves(metrics_csv: Path) -> tuple[dict[int, float], dict[int, float]]:
    """Training loss by step and validation MRR by epoch from a CSVLogger file."""
    train, val = {}, {}
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            if row.get("train/loss"):
                train[int(row["step"])] = float(row["train/loss"])
            if row.get("val/mrr"):
                val[int(row["epoch"])] = float(row["val/mrr"])
    return train, val


QUICK = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]


def run(name: str, extra: list[str], work: Path, path: str, quick: bool = False) -> dict:
    cwd = work / name
    cwd.mkdir(parents=True)
    common = ["--config", RECIPE, *extra, "--data.init_args.path", path, *(QUICK if quick else [])]
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "sessrec.cli", "fit", *common, "--trainer.log_every_n_steps", "1",
                    "--trainer.enable_progress_bar", "false"], cwd=cwd, check=True, capture_output=True, text=True)
    seconds = time.monotonic() - start
    tested = subprocess.run([sys.executable, "-m", "sessrec.cli", "test", *common, "--trainer.devices", "1",
                             "--model_dir", "runs/dlrm_trivago/model"],
                            cwd=cwd, check=True, capture_output=True, text=True)
    line = next(s for s in tested.stdout.splitlines() if s.startswith("[test]"))
    train, val = curves(next((cwd / "runs" / "dlrm_trivago" / "logs").glob("version_*/metrics.csv")))
    return {"train_loss": train, "val_mrr": val, "test_mrr": float(re.search(r"dlrm: .*?mrr=([0-9.]+)", line).group(1)),
            "fit_seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=str(LOG))
    parser.add_argument("--work", default=str(ROOT / "runs" / "sharded_dlrm"), help="scratch folder (replaced)")
    parser.add_argument("--quick", action="store_true", help="smoke size: " + " ".join(QUICK))
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    out = {name: run(name, extra, work, args.path, args.quick) for name, extra in RUNS.items()}
    one, two = out["one_process"], out["two_processes_sharded"]
    steps = sorted(set(one["train_loss"]) & set(two["train_loss"]))
    gaps = [abs(one["train_loss"][s] - two["train_loss"][s]) for s in steps]
    print(json.dumps({
        "benchmark": "sharded_dlrm",
        "quick": args.quick,
        "steps_compared": len(steps),
        "train_loss_max_abs_diff": max(gaps),
        "train_loss_first_last": {k: [v["train_loss"][steps[0]], v["train_loss"][steps[-1]]] for k, v in out.items()},
        "val_mrr_by_epoch": {k: v["val_mrr"] for k, v in out.items()},
        "test_mrr": {k: v["test_mrr"] for k, v in out.items()},
        "fit_seconds": {k: v["fit_seconds"] for k, v in out.items()},
    }))


if __name__ == "__main__":
    main()
