"""A session longer than the model reads (its ``inference.max_length``) gets the same top-k from ``sessrec predict``,
the server and an exported graph: each scores its latest max_length items (and their event times, for an encoder
that reads them), and with ``exclude_seen`` excludes only those. Seeded, untrained SASRec and HSTU (max_length 10,
top_k 8) saved as model directories; three sessions of 25 distinct items, so that the 15 early ones are
recommendable and the last 10 are not."""

from __future__ import annotations

from dataclasses import dataclass
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
from sessrec.models import CausalLanguageModeling, HSTUEncoder, SASRecEncoder
from sessrec.scoring import predict_file
from sessrec.serving.app import build_app
from sessrec.serving.recommender import SessionModelService
from sessrec.tasks import Evaluation, NextItemTask, SessionDataModule

torch.set_num_threads(1)
MAX_LENGTH, K, LONG = 10, 8, 25
SOURCE = {"num_sessions": 200, "num_items": 60}
ENCODERS = {"sasrec": (SASRecEncoder, "sessrec.models.SASRecEncoder"), "hstu": (HSTUEncoder, "sessrec.models.HSTUEncoder")}
SMALL = {"d_model": 16, "n_head": 2, "n_layer": 1}


@dataclass
class World:
    model_dir: Path
    recipe: Path  # the data recipe `sessrec predict` reads with the model directory
    sessions: list[list[int]]  # raw ids
    times: list[list[float]] | None  # each event's seconds, for an encoder that reads them

    def expected(self) -> list[list[int]]:
        """The top-k of the latest MAX_LENGTH items (and times) alone."""
        service = SessionModelService.from_pretrained(self.model_dir)
        times = None if self.times is None else [t[-MAX_LENGTH:] for t in self.times]
        return [r["item_ids"] for r in service.recommend([s[-MAX_LENGTH:] for s in self.sessions], k=K, times=times)]


@pytest.fixture(scope="module", params=list(ENCODERS))
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> World:
    folder = tmp_path_factory.mktemp(f"long_sessions_{request.param}")
    encoder, class_path = ENCODERS[request.param]
    dm = SessionDataModule(source=SyntheticSource(**SOURCE), max_length=MAX_LENGTH)
    torch.manual_seed(0)
    task = NextItemTask(num_items=dm.num_items, max_length=MAX_LENGTH, encoder=encoder(**SMALL),
                        objective=CausalLanguageModeling(), evaluation=Evaluation(top_k=K, exclude_seen=True))
    task.vocab = dm.vocab
    model_dir = task.recommender().save_pretrained(folder / "model")
    recipe = folder / "data.yaml"
    recipe.write_text(yaml.safe_dump({
        "data": {"source": {"class_path": "sessrec.data.SyntheticSource", "init_args": SOURCE}, "max_length": MAX_LENGTH},
        "model": {"encoder": {"class_path": class_path, "init_args": SMALL},
                  "objective": {"class_path": "sessrec.models.CausalLanguageModeling"}},
        "trainer": {"enable_progress_bar": False},
    }))
    raw = dm.vocab.raw_ids.to_pylist()[2:]
    rng = np.random.default_rng(0)
    sessions = [[raw[i] for i in rng.permutation(len(raw))[:LONG]] for _ in range(3)]
    times = None
    if request.param == "hstu":  # gaps of 1 s to a day, whole seconds (a CSV or parquet file holds them exactly)
        times = [(1.7e9 + np.cumsum(np.round(np.exp(rng.uniform(0, 11.4, LONG))))).tolist() for _ in range(3)]
    return World(model_dir, recipe, sessions, times)


def test_a_long_session_gets_the_same_top_k_from_predict_the_server_and_an_export(world: World, tmp_path) -> None:
    expected = world.expected()
    for session, top in zip(world.sessions, expected):
        assert len(top) == K and not set(top) & set(session[-MAX_LENGTH:])
    assert any(set(top) & set(session[:-MAX_LENGTH]) for session, top in zip(world.sessions, expected))

    columns = {"session_id": np.repeat([11, 12, 13], LONG), "item_id": sum(world.sessions, [])}
    if world.times is not None:
        columns["timestamp"] = np.array(sum(world.times, []), dtype=np.int64)
    events = tmp_path / "events.parquet"
    pq.write_table(pa.table(columns), events)
    cli(["predict", "--config", str(world.recipe), "--model_dir", str(world.model_dir), "--data.predict_path",
         str(events), "--scoring.output", str(tmp_path / "recs.parquet")])
    predicted = pq.read_table(tmp_path / "recs.parquet")
    assert predicted.column("session_id").to_pylist() == [11, 12, 13]
    assert predicted.column("item_ids").to_pylist() == expected
    predict_file(world.model_dir, events, tmp_path / "engine.parquet")  # sessrec predict --engine local, without the Trainer
    assert pq.read_table(tmp_path / "engine.parquet").column("item_ids").to_pylist() == expected

    timed = {} if world.times is None else {"times": world.times}
    with TestClient(build_app(SessionModelService.from_pretrained(world.model_dir))) as client:
        reply = client.post("/recommend", json={"sessions": world.sessions, "k": K, **timed})
        one = client.post("/recommend", json={"session": world.sessions[0], "k": K,
                                              **({} if world.times is None else {"times": world.times[0]})})
    assert reply.status_code == 200 and one.status_code == 200, (reply.json(), one.json())
    assert [r["item_ids"] for r in reply.json()["recommendations"]] == expected
    assert one.json()["recommendations"][0]["item_ids"] == expected[0]

    assert exported_top_k(world, tmp_path, "torchscript") == expected


@pytest.mark.slow
def test_a_long_session_gets_the_same_top_k_from_an_onnx_export(world: World, tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    assert exported_top_k(world, tmp_path, "onnx") == world.expected()


def exported_top_k(world: World, folder: Path, fmt: str) -> list[list[int]]:
    """The raw ids of the top-k the model directory's export in `fmt` gives the whole sessions."""
    from sessrec.lifecycle.export import export_model_dir, run_exported

    path = export_model_dir(world.model_dir, folder / fmt, fmt, top_k=K)
    vocab = SessionModelService.from_pretrained(world.model_dir).vocab
    items = torch.from_numpy(vocab.encode(pa.array(sum(world.sessions, []))).ids.reshape(len(world.sessions), LONG))
    inputs = [items] if world.times is None else [items, torch.tensor(world.times, dtype=torch.float64)]
    _, top_scores, top_items = run_exported(path, *inputs)
    return [r["item_ids"] for r in decode_dicts(vocab, top_items, top_scores)]
