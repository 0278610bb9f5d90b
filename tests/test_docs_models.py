"""docs/models.md's worked example runs as written: the encoder file, the research-code block (its own
asserts: causality, and the learned counting rule), and the recipe with the command line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "models.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S)


def test_the_doc_has_the_blocks_the_tests_run():
    assert len(blocks("python")) == 2 and len(blocks("yaml")) == 1 and len(blocks("bash")) == 1


def test_the_research_code_example_runs_and_learns():
    encoder_file, research = blocks("python")
    namespace: dict = {"__name__": "my_encoders"}
    exec(compile(encoder_file, "docs/models.md (my_encoders.py)", "exec"), namespace)
    exec(compile(research, "docs/models.md (research code)", "exec"), namespace)  # asserts inside
    scores = namespace["scores"]
    assert scores.shape == (1, 52) and scores.argmax().item() == 13
    assert torch.isinf(scores[0, :2]).all()  # padding and OOV are never recommended


@pytest.mark.slow
def test_the_recipe_example_trains_saves_and_loads(tmp_path):
    (tmp_path / "my_encoders.py").write_text(blocks("python")[0])
    (tmp_path / "my_conv.yaml").write_text(blocks("yaml")[0])
    command = blocks("bash")[0].strip()
    assert command == "PYTHONPATH=. sessrec fit --config recipes/data/synthetic.yaml --config my_conv.yaml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    run = subprocess.run(
        [sys.executable, "-m", "sessrec.cli", "fit", "--config", str(ROOT / "recipes/data/synthetic.yaml"),
         "--config", "my_conv.yaml", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "5",
         "--trainer.limit_val_batches", "2", "--data.source.init_args.num_sessions", "2000"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    directories = [p.parent for p in (tmp_path / "runs").rglob("config.json")]
    assert directories, f"no model directory under {tmp_path / 'runs'}"
    load = (
        "import sys, my_encoders\n"
        "from sessrec.artifacts import SessionRecommender\n"
        f"model = SessionRecommender.from_pretrained({str(directories[0])!r}).model\n"
        "print(type(model.encoder).__module__, type(model.encoder).__name__, model.encoder.convs[2].dilation[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", load], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["my_encoders", "CausalConvEncoder", "4"]
    refused = subprocess.run(
        [sys.executable, "-c", load.replace("import sys, my_encoders\n", "")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )
    assert refused.returncode != 0 and "my_encoders.CausalConvEncoder" in refused.stderr
