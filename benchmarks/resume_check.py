"""Kill-safety of ``sessrec fit``: a run killed with SIGKILL mid-epoch and resumed from ``last.ckpt``
ends where the uninterrupted run ends.

Runs the quickstart three times in a scratch folder (uninterrupted; killed at a training step; resumed
with ``--ckpt_path .../last.ckpt``) and prints JSON with the final validation metrics of both and their
largest difference.

    python benchmarks/resume_check.py [--recipe recipes/quickstart.yaml] [--kill_step 100]
    python benchmarks/resume_check.py --quick   # smoke run: the quickstart at tiny sizes, killed at step 6

`--quick` overrides the recipe's sizes on the command line (`QUICK`: 400 sessions of 60 items, a
one-layer width-16 encoder, batch 32, 2 epochs, last.ckpt every 3 steps) and kills at step 6.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

QUICK = ["--data.source.init_args.num_sessions", "400", "--data.source.init_args.num_items", "60",
         "--data.batch_size", "32", "--model.encoder.init_args.d_model", "16", "--model.encoder.init_args.n_head", "2",
         "--model.encoder.init_args.n_layer", "1", "--trainer.max_epochs", "2",
         "--last_checkpoint.every_n_train_steps", "3"]

KILLER = """
import os, signal, sys
from sessrec.tasks import NextItemTask
step = NextItemTask.training_step
def killed(self, batch, i):
    if self.global_step == {kill}:
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self, batch, i)
NextItemTask.training_step = killed
sys.argv = ["sessrec", "fit", "--config", {recipe!r}, *{extra!r}, "--trainer.enable_progress_bar", "false"]
from sessrec.cli import main
main()
"""


def fit(args: list[str], cwd: Path) -> dict[str, float]:
    subprocess.run([sys.executable, "-m", "sessrec.cli", "fit", *args, "--trainer.enable_progress_bar", "false"], cwd=cwd,
                   capture_output=True, text=True, check=True)
    (metrics,) = cwd.glob("runs/**/metrics.csv")  # a resumed run logs into the folder of the run it resumes
    with open(metrics, newline="") as fh:
        last = [row for row in csv.DictReader(fh) if row.get("val/loss")][-1]  # the last epoch's validation
    return {k: float(v) for k, v in last.items() if k.startswith("val/") and v}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/quickstart.yaml")
    parser.add_argument("--kill_step", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="smoke run: the recipe at tiny sizes (QUICK), killed at step 6")
    args = parser.parse_args()
    extra = QUICK if args.quick else []
    if args.quick:
        args.kill_step = 6
    recipe = str(Path(args.recipe).resolve())
    with tempfile.TemporaryDirectory() as scratch:
        whole, broken = Path(scratch) / "whole", Path(scratch) / "broken"
        whole.mkdir(), broken.mkdir()
        uninterrupted = fit(["--config", recipe, *extra], whole)
        killed = subprocess.run([sys.executable, "-c", KILLER.format(kill=args.kill_step, recipe=recipe, extra=extra)], cwd=broken, check=False,
                                capture_output=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if killed.returncode != -signal.SIGKILL:
            raise SystemExit(f"the run was not killed (exit {killed.returncode}): is --kill_step past the end of training?")
        (last,) = broken.glob("runs/**/last.ckpt")
        import torch

        saved_step = int(torch.load(last, weights_only=True, map_location="cpu")["global_step"])
        resumed = fit(["--config", recipe, *extra, "--ckpt_path", str(last)], broken)
    diff = max(abs(uninterrupted[k] - resumed[k]) for k in uninterrupted)
    print(json.dumps({"benchmark": "resume_check", "recipe": args.recipe, "quick": args.quick, "killed_at_step": args.kill_step,
                      "resumed_from_step": saved_step, "uninterrupted": uninterrupted, "resumed": resumed,
                      "max_abs_diff": diff}, indent=1))


if __name__ == "__main__":
    main()
