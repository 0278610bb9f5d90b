"""A session longer than the model reads (its ``inference.max_length``) gets the same top-k from ``sessrec predict``,
the server and an exported graph: each scores its latest max_length items, and with ``exclude_seen`` excludes only
those. One seeded, untrained SASRec (max_length 10, top_k 8) saved as a model directory; sessions of 25 items whose
early items the last 10 do not hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from fastapi.testclient import TestClient

from sessrec.cli import cli
from sessrec.data import SyntheticSource
from sessrec.data.vocab import decode_dicts
from sessrec.models import CausalLanguageModeling, SASRecEncoder
from sessrec.scoring import predict_file
from sessrec.serving.app import build_app
from sessrec.serving.recommender import SessionModelService
from sessrec.tasks import Evaluation, NextItemTask, SessionDataModule

torch.set_num_threads(1)
MAX_LENGTH, K, LONG = 10, 8, 25
SOURCE = {"num_sessions": 200, "num_items": 60}
SASREC = {"d_model": 16, "n_head": 2, "n_layer": 1}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[list[int]]]:
    """The model directory, the data recipe `sessrec predict` reads with it, and three long sessions of raw ids."""
    folder = tmp_path_factory.mktemp("long_sessions")
    dm = SessionDataModule(source=SyntheticSource(**SOURCE), max_length=MAX_LENGTH)
    torch.manual_seed(0)
    task = NextItemTask(num_items=dm.num_items, max_length=MAX_LENGTH, encoder=SASRecEncoder(**SASREC),
                        objective=CausalLanguageModeling(), evaluation=Evaluation(top_k=K, exclude_seen=True))
    task.vocab = dm.vocab
    model_dir = task.recommender().save_pretrained(folder / "model")
    recipe = folder / "data.yaml"
    recipe.write_text(yaml.safe_dump({
        "data": {"source": {"class_path": "sessrec.data.SyntheticSource", "init_args": SOURCE}, "max_length": MAX_LENGTH},
        "model": {"encoder": {"class_path": "sessrec.models.SASRecEncoder", "init_args": SASREC},
                  "objective": {"class_path": "sessrec.models.CausalLanguageModeling"}},
        "trainer": {"enable_progress_bar": False},
    }))
    raw = dm.vocab.raw_ids.to_pylist()[2:]
    rng = np.random.default_rng(0)
    sessions = []
    for _ in range(3):  # 15 early items, then 10 others: the early ones are recommendable, the last 10 are not
        order = rng.permutation(len(raw))
        sessions.append([raw[i] for i in order[:LONG]])
    return model_dir, recipe, sessions


def test_a_long_session_gets_the_same_top_k_from_predict_the_server_and_an_export(world, tmp_path) -> None:
    model_dir, recipe, sessions = world
    service = SessionModelService.from_pretrained(model_dir)
    expected = [r["item_ids"] for r in service.recommend([s[-MAX_LENGTH:] for s in sessions], k=K)]
    for session, top in zip(sessions, expected):
        assert len(top) == K and not set(top) & set(session[-MAX_LENGTH:])
    assert any(set(top) & set(session[:-MAX_LENGTH]) for session, top in zip(sessions, expected))

    events = tmp_path / "events.parquet"
    pq.write_table(pa.table({"session_id": np.repeat([11, 12, 13], LONG), "item_id": sum(sessions, [])}), events)
    cli(["predict", "--config", str(recipe), "--model_dir", str(model_dir), "--data.predict_path", str(events),
         "--scoring.output", str(tmp_path / "recs.parquet")])
    predicted = pq.read_table(tmp_path / "recs.parquet")
    assert predicted.column("session_id").to_pylist() == [11, 12, 13]
    assert predicted.column("item_ids").to_pylist() == expected
    predict_file(model_dir, events, tmp_path / "engine.parquet")  # sessrec predict --engine local, without the Trainer
    assert pq.read_table(tmp_path / "engine.parquet").column("item_ids").to_pylist() == expected

    with TestClient(build_app(service)) as client:
        reply = client.post("/recommend", json={"sessions": sessions, "k": K})
        one = client.post("/recommend", json={"session": sessions[0], "k": K})
    assert reply.status_code == 200 and one.status_code == 200
    assert [r["item_ids"] for r in reply.json()["recommendations"]] == expected
    assert one.json()["recommendations"][0]["item_ids"] == expected[0]

    assert exported_top_k(model_dir, sessions, tmp_path, "torchscript") == expected


@pytest.mark.slow
def test_a_long_session_gets_the_same_top_k_from_an_onnx_export(world, tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model_dir, _, sessions = world
    service = SessionModelService.from_pretrained(model_dir)
    expected = [r["item_ids"] for r in service.recommend([s[-MAX_LENGTH:] for s in sessions], k=K)]
    assert exported_top_k(model_dir, sessions, tmp_path, "onnx") == expected


def exported_top_k(model_dir: Path, sessions: list[list[int]], folder: Path, fmt: str) -> list[list[int]]:
    """The raw ids of the top-k the model directory's export in `fmt` gives the whole sessions."""
    from sessrec.lifecycle.export import export_model_dir, run_exported

    path = export_model_dir(model_dir, folder / fmt, fmt, top_k=K)
    vocab = SessionModelService.from_pretrained(model_dir).vocab
    items = torch.from_numpy(vocab.encode(pa.array(sum(sessions, []))).ids.reshape(len(sessions), -1))
    assert items.shape[1] == LONG
    _, top_scores, top_items = run_exported(path, items)
    return [r["item_ids"] for r in decode_dicts(vocab, top_items, top_scores)]
