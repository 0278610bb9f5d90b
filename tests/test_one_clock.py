"""One clock rule through every entry point: features of the session, never of the moment it is served.

A tiny pipeline whose LightGBM ranker is fitted with time features (`HandSessions` of
``test_pipeline_sessions``: sessions at known hours of known days, a popularity retriever), saved
and loaded. The test split's (prefix, target) pairs go, as raw-id sessions with their event times,
through the server, `Pipeline.recommend`, ``sessrec recommend`` (`recommend_file`) and the
evaluation (`evaluate_pipeline`), under two wall clocks twelve hours and three days apart
(``time.time`` frozen): every entry point gives the same lists under both, and the evaluation's
metrics are those of the lists served. A ``now`` before a session's last event is refused by each
entry point with the same message.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from fastapi.testclient import TestClient
from test_pipeline_sessions import T0, HandSessions, pipeline

from sessrec.data import EvalPairs
from sessrec.pipeline.offline import recommend_file
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.scoring import GBDTScorer
from sessrec.pipeline_training import fitting
from sessrec.serving.app import build_app
from sessrec.tasks import SessionDataModule

torch.set_num_threads(1)
pytest.importorskip("lightgbm")
K = 5
CLOCKS = (T0 + 3 * 86400.0, T0 + 6.5 * 86400.0)  # 06:00 on a Thursday, 18:00 on a Sunday: after every event


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pipeline, EvalPairs]:
    dm = SessionDataModule(source=HandSessions(), max_length=4)
    pipe = pipeline(dm)
    info = fitting.fit_ranker(pipe, dm.pairs("valid", "all_prefixes"), GBDTScorer(max_rounds=20, min_data_in_leaf=1, threads=1))
    assert {"session_duration", "time_hour_sin", "time_weekday_cos"} <= set(info["features"])
    loaded = Pipeline.from_pretrained(pipe.save_pretrained(tmp_path_factory.mktemp("pipe") / "pipeline"))
    return loaded, dm.pairs("test", "all_prefixes")


def requests(pipe: Pipeline, pairs: EvalPairs) -> tuple[list[list[int]], list[list[float]]]:
    """The pairs' prefixes as raw-id sessions and their event times."""
    real = pairs.items != 0
    sessions = [pipe.vocab.decode(row[keep].numpy()).to_pylist() for row, keep in zip(pairs.items, real)]
    return sessions, [row[keep].tolist() for row, keep in zip(pairs.times, real)]


def at_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Every ``time.time()`` reads `seconds` (the server's arrival, the pipeline's and the offline run's clock)."""
    monkeypatch.setattr(time, "time", lambda: seconds)


def ids(recs: list[dict]) -> list[list]:
    return [r["item_ids"] for r in recs]


def served_lists(pipe: Pipeline, sessions: list, times: list, tmp_path: Path) -> dict[str, list[list]]:
    """The lists of every entry point for these sessions, with their times and no ``now``."""
    lists = {"recommend": ids(pipe.recommend(sessions, k=K, times=times))}
    with TestClient(build_app(pipe, max_wait_ms=1.0)) as client:
        reply = client.post("/recommend", json={"sessions": sessions, "times": times, "k": K})
    assert reply.status_code == 200, reply.text
    lists["server"] = ids(reply.json()["recommendations"])
    src, out = tmp_path / "sessions.parquet", tmp_path / "recs.parquet"
    pq.write_table(pa.table({"session_id": list(range(len(sessions))), "item_id": sessions, "timestamp": times}), src)
    recommend_file(pipe, src, out, k=K, overwrite=True)
    lists["sessrec recommend"] = pq.read_table(out).column("item_ids").to_pylist()
    return lists


def test_every_entry_point_gives_the_same_lists_whatever_the_wall_clock(
    fitted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe, pairs = fitted
    sessions, times = requests(pipe, pairs)
    by_clock, metrics = [], []
    for seconds in CLOCKS:
        with monkeypatch.context() as patch:
            at_clock(patch, seconds)
            by_clock.append(served_lists(pipe, sessions, times, tmp_path))
            metrics.append(fitting.evaluate_pipeline(pipe, pairs, ks=(K - 1,)))
    first = by_clock[0]["recommend"]
    assert all(len(lists) == K for lists in first)
    for lists in by_clock:
        assert lists == {name: first for name in lists}
    # the evaluation ranks the targets in the lists served, whatever the clock
    assert metrics[0] == metrics[1]
    recs = pipe.recommend(sessions, k=K, times=times)
    served = torch.from_numpy(np.stack([pipe.vocab.encode(pa.array(r["item_ids"])).ids for r in recs]))
    scores = torch.tensor([r["scores"] for r in recs])
    sums = fitting.list_metrics(served, scores, pairs.targets.long(), ks=(K - 1,), by_score=pipe.ordering.by_score)
    assert {name: value for name, value in metrics[0].items() if name != "candidate_recall"} == pytest.approx(
        {name: value / len(pairs) for name, value in sums.items()})


def test_the_features_are_the_last_events_hour_and_weekday(fitted) -> None:
    """Served at its last event or days later, a session has the same features: those of its last event."""
    pipe, pairs = fitted
    sessions = fitting.sessions_of(pairs.take(slice(0, 2)))
    cands = pipe.candidates(sessions)
    at_event = pipe.features.transform(sessions, cands, pipe.stage_retrievers)
    later = type(sessions)(sessions.items, sessions.times, now=sessions.now + 3.5 * 86400)
    assert torch.equal(pipe.features.transform(later, cands, pipe.stage_retrievers).dense, at_event.dense)


NOW = T0 + 2 * 86400.0  # the test day's 06:00: before the later events of its sessions


def test_a_now_before_the_last_event_is_refused_alike_everywhere(fitted, tmp_path: Path) -> None:
    pipe, pairs = fitted
    sessions, times = requests(pipe, pairs)
    row = next(i for i, t in enumerate(times) if t[-1] > NOW + 300)
    message = (f"now {NOW:.0f} is {times[row][-1] - NOW:.0f} s before the last event of session {row} "
               f"({times[row][-1]:.0f}): a session is served after its events")
    with pytest.raises(ValueError) as api:
        pipe.recommend(sessions, k=K, now=NOW, times=times)
    assert str(api.value) == message
    with TestClient(build_app(pipe, max_wait_ms=1.0)) as client:
        reply = client.post("/recommend", json={"sessions": sessions, "times": times, "k": K, "now": NOW})
    assert (reply.status_code, reply.json()) == (422, {"error": message})
    src = tmp_path / "sessions.parquet"
    pq.write_table(pa.table({"session_id": list(range(len(sessions))), "item_id": sessions, "timestamp": times}), src)
    with pytest.raises(ValueError) as offline:
        recommend_file(pipe, src, tmp_path / "recs.parquet", k=K, now=NOW)
    assert str(offline.value) == f"{src}: {message}"
