"""Cold start of the serving path: the imports it pays for, and ``sessrec serve`` until ``/health`` answers.

For each checkout given by `--checkout NAME=PATH[,MODEL_DIR]` (a sessrec source tree, put first on
``PYTHONPATH``, and the directory it serves, default `--model-dir`; default: this repository as
``current``), interleaved over `--repeats` rounds:

- ``python -X importtime -c "import M"`` for each module of `--modules`: the cumulative import
  time of `M` and which of Lightning, lightning_fabric and jsonargparse it loaded;
- ``python -X importtime -m sessrec.cli serve --model_dir D --port P`` started fresh: seconds until
  ``GET /health`` answers 200, the process's RSS then, and which of the training-stack packages it
  imported (from its own ``-X importtime`` lines, which cost both checkouts the same).

Prints one JSON line per checkout with the medians. The machine is shared: run the checkouts
interleaved (as here) and compare them with each other, not with figures of another run.

Example (from the repository root, after ``sessrec fit --config recipes/pipeline_rsc15.yaml``):
    python benchmarks/serve_cold_start.py --model-dir runs/pipeline_rsc15/pipeline
    python benchmarks/serve_cold_start.py --checkout before=/tmp/sessrec-before,/tmp/before/pipeline --checkout current=.
    python benchmarks/serve_cold_start.py --quick   # smoke run: one round, a tiny pipeline it builds itself

`--quick` runs one round, times the import of `sessrec.serving.server` alone and, unless `--model-dir`
is given, serves a tiny co-visitation pipeline (synthetic sessions, 60 items) saved in a scratch folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINING_STACK = ("pytorch_lightning", "lightning_fabric", "lightning", "jsonargparse")


def environment(checkout: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    return env


def import_time(checkout: Path, module: str) -> tuple[float, list[str]]:
    """Seconds of `module`'s import (its cumulative time in ``-X importtime``) and the training-stack packages it loaded."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True,
                         env=environment(checkout), cwd="/", check=True).stderr
    total, loaded = None, set()
    for line in out.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        name = parts[2]
        if name.split(".")[0] in TRAINING_STACK:
            loaded.add(name.split(".")[0])
        if name == module:
            total = int(parts[1]) / 1e6
    if total is None:
        raise RuntimeError(f"{module} does not appear in -X importtime's output")
    return total, sorted(loaded)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_start(checkout: Path, model_dir: Path, timeout: float) -> dict[str, object]:
    """Start ``sessrec serve``; seconds until /health is 200, RSS (MiB) then and the training-stack packages it imported."""
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "sessrec.cli", "serve", "--model_dir",
                             str(model_dir.resolve()), "--port", str(port), "--log_level", "warning", "--access_log", "false"],
                            env=environment(checkout), cwd="/", stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"sessrec serve exited with {proc.returncode}: {log.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"/health did not answer within {timeout} s")
            time.sleep(0.02)
        seconds = time.perf_counter() - started
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024
        log.seek(0)
        imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in log if line.startswith("import time:")}
        return {"seconds": seconds, "rss_mib": rss, "training_stack": sorted(imported & set(TRAINING_STACK))}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="the directory served (default: runs/pipeline_rsc15/pipeline)")
    parser.add_argument("--checkout", action="append", default=[],
                        help="NAME=PATH[,MODEL_DIR]: a sessrec source tree and the directory it serves")
    parser.add_argument("--modules", nargs="+", default=["sessrec.pipeline", "sessrec.serving.server", "sessrec.lifecycle.export"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one round, sessrec.serving.server's import, a tiny pipeline unless --model-dir")
    args = parser.parse_args()
    scratch = None
    if args.quick:
        args.repeats, args.modules = 1, ["sessrec.serving.server"]
        if args.model_dir is None:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from serve_load import tiny_pipeline  # the same tiny pipeline the load benchmark serves

            scratch = tempfile.TemporaryDirectory(prefix="serve_cold_start_")
            args.model_dir = tiny_pipeline(Path(scratch.name) / "pipeline")
    args.model_dir = args.model_dir or ROOT / "runs/pipeline_rsc15/pipeline"
    given = dict(c.split("=", 1) for c in args.checkout) or {"current": str(ROOT)}
    checkouts = {name: Path(spec.split(",")[0]).resolve() for name, spec in given.items()}
    served = {name: Path(spec.split(",")[1]) if "," in spec else args.model_dir for name, spec in given.items()}
    results: dict[str, dict[str, list]] = {name: {} for name in checkouts}
    for round_ in range(args.repeats):
        for name, path in checkouts.items():
            for module in args.modules:
                seconds, loaded = import_time(path, module)
                results[name].setdefault(f"import {module}", []).append((seconds, loaded))
            start = serve_start(path, served[name], args.timeout)
            results[name].setdefault("serve", []).append(start)
            print(f"round {round_ + 1}: {name}: serve ready in {start['seconds']:.2f} s", file=sys.stderr)
    for name, measured in results.items():
        line: dict[str, object] = {"checkout": name, "path": str(checkouts[name]), "model_dir": str(served[name]),
                                   "repeats": args.repeats}
        for key, runs in measured.items():
            if key == "serve":
                line["serve_ready_s_median"] = round(statistics.median(r["seconds"] for r in runs), 3)
                line["serve_ready_s_runs"] = [round(r["seconds"], 3) for r in runs]
                line["serve_rss_mib_median"] = round(statistics.median(r["rss_mib"] for r in runs), 1)
                line["serve_training_stack"] = runs[-1]["training_stack"]
            else:
                line[f"{key}_s_median"] = round(statistics.median(s for s, _ in runs), 3)
                line[f"{key}_training_stack"] = runs[-1][1]
        print(json.dumps(line))
    if scratch is not None:
        scratch.cleanup()


if __name__ == "__main__":
    main()
