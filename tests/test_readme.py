"""The README's commands are real: the quickstart command trains, the test command is CI's, the code runs."""

import csv
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_first_block_is_install_and_quickstart_then_tests():
    first = [line.split("#")[0].strip() for line in blocks("bash")[0].strip().splitlines()]
    assert first[0].startswith("pip install torch==2.13.0 && pip install -e .")
    assert first[0].endswith("sessrec fit --config recipes/quickstart.yaml")
    test_cmd = first[1].split("&&")[-1].strip()
    assert test_cmd == "python -m pytest -q -n 2 --dist worksteal"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q torch==2.13.0" in ci and ci.index("torch==2.13.0") < ci.index("-e '.[dev]'")
    assert ci.strip().splitlines()[-1].strip() == test_cmd


def test_python_examples_run(monkeypatch):
    monkeypatch.chdir(ROOT)
    for code in blocks("python"):
        compiled = compile(code, "README.md", "exec")
        # a block that loads a trained pipeline runs where `sessrec fit` has made it (tests/test_pipeline.py
        # runs the same calls on a tiny pipeline); every block compiles
        needs = [p for p in re.findall(r'"(runs/[^"]+)"', code) if not (ROOT / p).exists()]
        if not needs:
            exec(compiled, {})


@pytest.mark.slow
def test_quickstart_command_trains(tmp_path):
    exe = shutil.which("sessrec") or pytest.skip("console script not installed")
    cmd = [exe, "fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.enable_progress_bar", "false"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = next(tmp_path.glob("runs/quickstart/*/metrics.csv"))
    with metrics.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("val/recall@20")]
    assert len(rows) == 3
    recall = [float(r["val/recall@20"]) for r in rows]
    # synthetic Markov sessions are learnable: well above chance, improving with training
    assert recall[-1] > 0.6 and recall[-1] > recall[0]
    assert next(tmp_path.glob("runs/quickstart/*/model/vocab.parquet"))  # the model directory sessrec fit writes


@pytest.mark.slow
def test_yaml_examples_configure_a_working_quickstart(tmp_path, monkeypatch):
    from sessrec.cli import cli

    monkeypatch.chdir(tmp_path)
    for i, block in enumerate(blocks("yaml")):
        overlay = tmp_path / f"block{i}.yaml"
        overlay.write_text(block)
        run = cli([
            "fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--config", str(overlay),
            "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false",
        ])
        assert run.trainer.state.finished
