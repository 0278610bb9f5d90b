"""Time through the pipeline: validity windows opening and closing at the request time, event times.

A hand-built world: raw ids 10..70; co-visitation fitted on sessions ``[10, x]``, ``[10, 20]`` once,
``[10, 30]`` twice ... ``[10, 70]`` six times, so the session ``[10]`` is recommended
70, 60, 50, 40, 30, 20 (the pair counts, best first). Two rule tables, valid in [T0, T1):

- deny: 70 and 50 in [T0, T1); 40 from T1 on (it closes as the first window opens);
- allow: 60 always; 40 in [T0, T1).

The same four request times go through `Pipeline.recommend` (``now``), the server (the request's
``now``) and `recommend_file` (the time column: each session's last event).
"""

from __future__ import annotations

import json
import re
import time
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
from fastapi.testclient import TestClient

from sessrec.data.schema import Schema, SchemaError
from sessrec.data.stream import ScoringStream
from sessrec.data.vocab import ItemVocab
from sessrec.pipeline import clock, offline
from sessrec.pipeline.candidate_features import CandidateFeatures
from sessrec.pipeline.candidates import RequestSessions
from sessrec.pipeline.filters import ItemTableFilter
from sessrec.pipeline.offline import recommend_file
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.request import check_request
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.pipeline.scoring import Scorer
from sessrec.serving import app as serving_app
from sessrec.serving.app import build_app
from sessrec.serving.recommender import join_sessions

torch.set_num_threads(1)
T0, T1 = 1_700_000_000.0, 1_700_086_400.0  # a day's window [T0, T1)
SESSION = [10]
BASE = [70, 60, 50, 40, 30, 20]  # the session's recommendations without rules
NOWS = (T0 - 1, T0, T1 - 1, T1)
EXPECTED = {  # request time -> the recommendations (k = 4), by hand from the tables above
    "deny": {T0 - 1: [70, 60, 50, 40], T0: [60, 40, 30, 20], T1 - 1: [60, 40, 30, 20], T1: [70, 60, 50, 30]},
    "allow": {T0 - 1: [60], T0: [60, 40], T1 - 1: [60, 40], T1: [60]},
}
K = 4


@pytest.fixture(scope="module")
def vocab() -> ItemVocab:
    return ItemVocab(pa.array([10, 20, 30, 40, 50, 60, 70]), np.array([21, 6, 5, 4, 3, 2, 1]))


def table(path: Path, **columns: list) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ItemTableFilter]:
    folder = tmp_path_factory.mktemp("rules")
    deny = table(folder / "deny.parquet", item_id=[70, 50, 40], valid_from=pa.array([T0, T0, T1]),
                 valid_to=pa.array([T1, T1, None], pa.float64()))
    allow = table(folder / "allow.parquet", item_id=[60, 40], valid_from=pa.array([None, T0], pa.float64()),
                  valid_to=pa.array([None, T1], pa.float64()))
    return {"deny": ItemTableFilter(deny, mode="deny"), "allow": ItemTableFilter(allow, mode="allow")}


def build(vocab: ItemVocab, filters=()) -> Pipeline:
    pairs = [[10, other] for n, other in enumerate([20, 30, 40, 50, 60, 70], start=1) for _ in range(n)]
    train = torch.from_numpy(vocab.encode(pa.array(np.ravel(pairs))).ids.reshape(-1, 2))
    covisitation = CoVisitation().fit(train, len(vocab))
    return Pipeline(vocab, {"covisitation": (covisitation, 10)}, max_length=4, history_length=8, max_candidates=10,
                    filters=filters)


@pytest.fixture(scope="module")
def pipes(vocab: ItemVocab, rules: dict[str, ItemTableFilter]) -> dict[str, Pipeline]:
    return {"plain": build(vocab), **{mode: build(vocab, [rule]) for mode, rule in rules.items()}}


def ids(recs: list[dict]) -> list[list]:
    return [r["item_ids"] for r in recs]


def at_clock(monkeypatch: pytest.MonkeyPatch, module, seconds: float) -> None:
    """Make `module`'s clock read `seconds`."""
    monkeypatch.setattr(module, "time", types.SimpleNamespace(time=lambda: seconds, monotonic=time.monotonic))


def with_time_features(pipe: Pipeline) -> Pipeline:
    """`pipe` as if its ranker had been fitted with time features (the refusals come before any scoring)."""
    features = CandidateFeatures()
    features.names = ["covisitation_score", "session_duration", "time_hour_cos", "time_hour_sin"]
    return Pipeline(pipe.vocab, pipe.retrievers, pipe.max_length, pipe.max_candidates, pipe.history_length,
                    pipe.filters[1:], features, scorer=Scorer())  # never asked to score


# -------------------------------------------------------------------------------- Pipeline.recommend
def test_without_rules_the_session_gets_its_pair_counts_in_order(pipes) -> None:
    assert ids(pipes["plain"].recommend([SESSION], k=10)) == [BASE]


@pytest.mark.parametrize("mode", ["deny", "allow"])
@pytest.mark.parametrize("now", NOWS)
def test_recommend_applies_the_windows_at_now(pipes, mode: str, now: float) -> None:
    assert ids(pipes[mode].recommend([SESSION], k=K, now=now)) == [EXPECTED[mode][now]]


@pytest.mark.parametrize("mode", ["deny", "allow"])
def test_recommend_takes_one_now_per_session(pipes, mode: str) -> None:
    recs = pipes[mode].recommend([SESSION] * 4, k=K, now=list(NOWS))
    assert ids(recs) == [EXPECTED[mode][now] for now in NOWS]


def test_recommend_defaults_to_the_wall_clock(pipes, monkeypatch: pytest.MonkeyPatch) -> None:
    at_clock(monkeypatch, clock, T0)
    assert ids(pipes["deny"].recommend([SESSION], k=K)) == [EXPECTED["deny"][T0]]
    assert pipes["deny"].encode(check_request([SESSION])).now.tolist() == [T0]
    at_clock(monkeypatch, clock, T1)
    assert ids(pipes["deny"].recommend([SESSION], k=K)) == [EXPECTED["deny"][T1]]
    # with event times the request is served at each session's last event, whatever the clock
    assert pipes["deny"].encode(check_request([SESSION, [10, 20]], times=[[T0 - 5], [T0 - 9, T0]])).now.tolist() == [
        T0 - 5, T0]
    assert ids(pipes["deny"].recommend([SESSION], k=K, times=[[T0 - 5]])) == [EXPECTED["deny"][T0 - 1]]


def test_times_fill_the_sessions_right_aligned_as_the_items(pipes) -> None:
    pipe = pipes["plain"]
    sessions = [[10, 20, 30], [10, 20, 30, 40, 50, 60]]  # 3 events; 6 (the stages see the last 4)
    times = [[100, 200, 300.5], [1, 2, 3, 4, 5, 6]]
    encoded = pipe.encode(check_request(sessions, now=T0, times=times))
    assert encoded.times.dtype == torch.float64
    assert encoded.times.tolist() == [[0, 100, 200, 300.5], [3, 4, 5, 6]]
    assert encoded.items[0, 0] == 0 and (encoded.items[1] != 0).all()  # padding where the times are 0
    assert encoded.now.tolist() == [T0, T0]
    assert encoded.history.shape == (2, 6)
    # a ranker fitted without time features reads none: times change nothing
    assert pipe.recommend(sessions, k=K, now=T0, times=times) == pipe.recommend(sessions, k=K, now=T0)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"now": float("nan")}, ValueError, "now nan is not a time in seconds since the epoch: not a number"),
        ({"now": -1}, ValueError, r"now -1 is not a time in seconds since the epoch: before 1970 \(negative\)"),
        ({"now": 1_700_000_000_000}, ValueError, r"now 1700000000000 is not .* after the year 3000 \(milliseconds\?"),
        ({"now": [T0, T0, T0]}, ValueError, "now holds 3 times for 2 sessions"),
        ({"now": "today"}, ValueError, "now must be seconds since the epoch"),
        ({"times": [[1.0], [1.0]]}, ValueError, "times of session 1 has 1 values for its 2 item ids"),
        ({"times": [[1.0]]}, ValueError, "times has 1 lists for 2 sessions"),
        ({"times": [[1.0], [5.0, 4.0]]}, ValueError, r"times of session 1 go back at position 1 \(4 after 5\)"),
        ({"times": [[1.0], [1_700_000_000.25, 1_700_000_000.0]]}, ValueError,
         r"go back at position 1 \(1700000000 after 1700000000\.25\)"),  # every digit: the two differ
        ({"now": T0, "times": [[T0 - 60], [T0, T0 + 301]]}, ValueError,
         rf"now {T0:.0f} is 301 s before the last event of session 1 \({T0 + 301:.0f}\): a session is served after its events"),
        ({"times": [[1.0], [5.0, 1.7e12]]}, ValueError, "session 1's event time 1700000000000 is not a time .* year 3000"),
        ({"times": [[1.0], [5.0, "6"]]}, ValueError, "times of session 1 must be numbers .* got '6'"),
        ({"times": [[T0], [T0, 4_102_444_800]]}, ValueError,  # 2100-01-01: the data readers refuse it too
         r"^session 1's event time 4102444800 is after 2100: give seconds since the epoch, as the data readers"),
        ({"times": [[T0], [100.0, T0]]}, ValueError,
         r"^times of session 1 hold 100, before 1990, beside 1700000000: give every event's time in seconds since"),
    ],
)
def test_implausible_times_are_refused_in_one_line(pipes, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        pipes["deny"].recommend([[10], [10, 20]], k=K, **kwargs)


def test_a_last_event_may_follow_the_request_time_by_the_clock_skew_only(pipes) -> None:
    """The caller's clock may run ahead of the server's by up to CLOCK_SKEW (300 s); half a second more is refused."""
    pipe = pipes["deny"]
    assert clock.CLOCK_SKEW == 300
    assert pipe.encode(check_request([[10, 20]], now=T0, times=[[T0 - 5, T0 + 300]])).now.tolist() == [T0]
    with pytest.raises(ValueError, match="now 1700000000 is 300.5 s before the last event of session 0"):
        pipe.recommend([[10, 20]], now=T0, times=[[T0 - 5, T0 + 300.5]])


def test_a_ranker_with_time_features_refuses_sessions_without_times(pipes) -> None:
    pipe = with_time_features(pipes["plain"])
    assert pipe.time_features == ["session_duration", "time_hour_cos", "time_hour_sin"]
    with pytest.raises(ValueError, match=r"fitted with time features \(session_duration, time_hour_cos, time_hour_sin\): "
                                         r"give every session's event times \(times: "):
        pipe.recommend([SESSION], k=K, now=T0)
    assert pipe.encode(check_request([SESSION], now=T0, times=[[T0 - 60]])).times.tolist() == [[0, 0, 0, T0 - 60]]
    with pytest.raises(ValueError, match=r"give every session's event times \(RequestSessions.times\)"):
        pipe.score(RequestSessions(torch.tensor([[2]]), now=torch.tensor([T0], dtype=torch.float64)), pipe.candidates(
            RequestSessions(torch.tensor([[2]]))))
    assert pipes["plain"].time_features == []  # no ranker


def test_join_sessions_keeps_each_requests_now_and_the_times_all_of_them_gave(pipes) -> None:
    pipe = pipes["plain"]
    timed = pipe.encode(check_request([[10, 20]], now=T0, times=[[1.0, 2.0]]))
    untimed = pipe.encode(check_request([[30]], now=T1))
    both = join_sessions([timed, pipe.encode(check_request([[40]], now=T1 - 1, times=[[3.0]]))])
    assert both.now.tolist() == [T0, T1 - 1]
    assert both.times.tolist() == [[0, 0, 1, 2], [0, 0, 0, 3]]
    mixed = join_sessions([timed, untimed])
    assert mixed.now.tolist() == [T0, T1] and mixed.times is None
    with pytest.raises(ValueError, match="some parts have a request time"):
        join_sessions([timed, RequestSessions(torch.tensor([[2]]))])


# ------------------------------------------------------------------------------------------ server
@pytest.mark.parametrize("mode", ["deny", "allow"])
def test_the_server_applies_the_windows_at_the_requests_now(pipes, mode: str) -> None:
    with TestClient(build_app(pipes[mode], max_wait_ms=1.0)) as client:
        for now in NOWS:
            reply = client.post("/recommend", json={"session": SESSION, "k": K, "now": now})
            assert reply.status_code == 200, reply.text
            assert ids(reply.json()["recommendations"]) == [EXPECTED[mode][now]]
        both = client.post("/recommend", json={"sessions": [SESSION, [10, 20]], "k": K, "now": int(T0),
                                               "times": [[T0 - 9], [T0 - 9, T0 - 1]]})
        assert ids(both.json()["recommendations"])[0] == EXPECTED[mode][T0]


def test_the_server_serves_a_request_without_now_at_its_arrival(pipes, monkeypatch: pytest.MonkeyPatch) -> None:
    with TestClient(build_app(pipes["deny"], max_wait_ms=1.0)) as client:
        for now in (T0 - 1, T0, T1):
            at_clock(monkeypatch, serving_app, now)
            reply = client.post("/recommend", json={"session": SESSION, "k": K})
            assert ids(reply.json()["recommendations"]) == [EXPECTED["deny"][now]]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"session": SESSION, "now": "today"}, r"now must be seconds since the epoch \(a number, or one per session\), got 'today'"),
        ({"session": SESSION, "now": True}, "now must be seconds since the epoch .*, got True"),
        ({"session": SESSION, "now": -5}, "now -5 is not a time in seconds since the epoch: before 1970"),
        ({"session": SESSION, "now": 1_700_000_000_000}, r"now 1700000000000 is not a time .*year 3000 \(milliseconds"),
        ({"session": SESSION, "now": 10**400}, r"now 100000000000\.\.\. \(401 digits\) is not a time"),
        ({"session": SESSION, "times": 5}, "times of session 0 must be a list of numbers, got int"),
        ({"session": [10, 20], "times": [T0]}, "times of session 0 has 1 values for its 2 item ids"),
        ({"sessions": [SESSION], "times": [T0]}, "times of session 0 must be a list of numbers, got float"),
        ({"sessions": [SESSION, SESSION], "times": [[T0]]}, "times has 1 lists for 2 sessions"),
        ({"session": [10, 20], "times": [T0, T0 - 1]}, "times of session 0 go back at position 1"),
        ({"session": [10, 20], "now": T0, "times": [T0, T0 + 3600]}, "is 3600 s before the last event of session 0"),
        ({"session": SESSION, "times": [1_700_000_000_000]}, "session 0's event time 1700000000000 is not a time"),
        ({"session": SESSION, "when": T0}, r"unknown field\(s\) \['when'\]; the fields are \[.*'now'.*'times'\]"),
    ],
)
def test_bad_times_in_a_request_get_422_naming_the_field(pipes, body: dict, message: str) -> None:
    with TestClient(build_app(pipes["deny"], max_wait_ms=1.0)) as client:
        reply = client.post("/recommend", content=json.dumps(body))
    assert reply.status_code == 422
    assert len(reply.json()["error"].splitlines()) == 1
    assert re.search(message, reply.json()["error"]), reply.json()["error"]


def test_a_ranker_with_time_features_refuses_times_before_1990_in_every_path(pipes, tmp_path: Path) -> None:
    """Times from another origin than the epoch (seconds since a session's start) pass the readers as relative times,
    but would give a ranker that reads the hour and weekday of absolute times hours that never happened: refused."""
    pipe = with_time_features(pipes["plain"])
    message = (r"event time [17]0+ is not in 1990\.\.2100 in seconds since the epoch: the pipeline's ranker reads the "
               r"hour and weekday of each session's times \(session_duration, time_hour_cos, time_hour_sin\)")
    with pytest.raises(ValueError, match=message):
        pipe.recommend([SESSION], k=K, times=[[100.0] * len(SESSION)], now=160.0)
    with pytest.raises(ValueError, match=message):
        pipe.ranking_inputs(pipe.wrap(torch.tensor([[0, 2]]), torch.tensor([[0.0, 100.0]])), None)
    with TestClient(build_app(pipe, max_wait_ms=1.0)) as client:
        reply = client.post("/recommend", json={"session": SESSION, "times": [100.0] * len(SESSION), "now": 160.0})
    assert reply.status_code == 422 and "event time 100 is not in 1990..2100" in reply.json()["error"]
    src = tmp_path / "events.csv"
    write_sessions(src, [100.0], "events")
    with pytest.raises(ValueError, match=message):
        recommend_file(pipe, src, tmp_path / "recs.parquet", k=K)
    assert not (tmp_path / "recs.parquet").exists()
    assert pipe.encode(check_request([SESSION], now=T0, times=[[T0 - 60] * len(SESSION)])).times is not None


def test_the_times_of_encoded_sessions_are_checked_once(pipes, monkeypatch: pytest.MonkeyPatch) -> None:
    """`encode` checks the times of a ranker's sessions and marks the batch, so that `ranking_inputs` does not check
    them again; sessions from anywhere else are checked there."""
    pipe = with_time_features(pipes["plain"])
    checked, check = [], pipe.check_times
    monkeypatch.setattr(pipe, "check_times", lambda items, times: checked.append(times.shape) or check(items, times))
    monkeypatch.setattr(pipe.features, "transform", lambda *args: "features")
    sessions = pipe.encode(check_request([SESSION], now=T0, times=[[T0 - 60] * len(SESSION)]))
    assert checked == [(1, len(SESSION))] and pipe.ranking_inputs(sessions, None) == "features"
    assert checked == [(1, len(SESSION))]
    wrapped = pipe.wrap(torch.tensor([[0, 2]]), torch.tensor([[0.0, T0]]))
    assert pipe.ranking_inputs(wrapped, None) == "features" and checked[1:] == [(1, pipe.max_length)]


def test_the_server_refuses_a_request_without_times_for_a_ranker_that_reads_them(pipes) -> None:
    with TestClient(build_app(with_time_features(pipes["plain"]), max_wait_ms=1.0)) as client:
        reply = client.post("/recommend", json={"session": SESSION, "now": T0})
    assert reply.status_code == 422
    assert "fitted with time features (session_duration, time_hour_cos, time_hour_sin)" in reply.json()["error"]
    assert "event times (times:" in reply.json()["error"]


# ----------------------------------------------------------------------------------- recommend_file
def write_sessions(path: Path, last_times: list[float], layout: str, unit: float = 1.0) -> None:
    """One copy of the session ``[10, 10]`` (recommended as ``[10]``) per time, session ids 1, 2, ...,
    its events at t - 30 and t (times `unit`): a list column, rows of events, or no time column."""
    sid = list(range(1, len(last_times) + 1))
    items = [[10, 10] for _ in last_times]
    times = [[(t - 30) * unit, t * unit] for t in last_times]
    if layout == "lists":
        pq.write_table(pa.table({"session_id": sid, "item_id": items, "timestamp": times}), path)
    elif layout == "events":
        rows = [(s, i, t) for s, its, ts in zip(sid, items, times) for i, t in zip(its, ts)]
        pacsv.write_csv(pa.table(dict(zip(["session_id", "item_id", "timestamp"], map(list, zip(*rows))))), path)
    else:
        pq.write_table(pa.table({"session_id": sid, "item_id": items}), path)


def recommended(path: Path) -> list[list]:
    return pq.read_table(path).column("item_ids").to_pylist()


@pytest.mark.parametrize("layout", ["lists", "events"])
@pytest.mark.parametrize("mode", ["deny", "allow"])
def test_recommend_file_applies_the_windows_at_each_sessions_last_event(
    pipes, tmp_path: Path, layout: str, mode: str
) -> None:
    src = tmp_path / ("sessions.parquet" if layout == "lists" else "events.csv")
    write_sessions(src, list(NOWS), layout)
    counts = recommend_file(pipes[mode], src, tmp_path / "recs.parquet", k=K, batch_size=3)
    assert counts["now"] is None  # each session at its last event
    assert recommended(tmp_path / "recs.parquet") == [EXPECTED[mode][now] for now in NOWS]
    # a `now` given (after every session's last event) serves every session at it
    recommend_file(pipes[mode], src, tmp_path / "later.parquet", k=K, now=T1 + 1)
    assert recommended(tmp_path / "later.parquet") == [EXPECTED[mode][T1]] * 4


def test_scoring_stream_gives_event_times_right_aligned_in_time_order(vocab: ItemVocab, tmp_path: Path) -> None:
    src = tmp_path / "events.csv"  # each session's events newest first in the file
    pacsv.write_csv(pa.table({"session_id": [1, 1, 2], "item_id": [10, 20, 30], "timestamp": [T0, T0 - 30, T1]}), src)
    batches = list(ScoringStream(src, vocab, Schema(), max_length=3, batch_size=8, times=True))
    assert [b.times.tolist() for b in batches] == [[[T0 - 30, T0], [0.0, T1]]]  # one batch, 0 on padding
    model_id = dict(zip([10, 20, 30], vocab.encode(pa.array([10, 20, 30])).ids.tolist()))
    assert [b.items.tolist() for b in batches] == [[[model_id[20], model_id[10]], [0, model_id[30]]]]
    lists = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"session_id": [1, 2], "item_id": [[10, 20], [30]], "timestamp": [[T0, T0 - 30], [T1]]}),
                   lists)
    (one,) = ScoringStream(lists, vocab, Schema(), max_length=3, batch_size=8, times=True)
    assert one.times.tolist() == [[T0 - 30, T0], [0, T1]]
    assert one.items.tolist() == [[model_id[20], model_id[10]], [0, model_id[30]]]
    assert ScoringStream(src, vocab, Schema(timestamp=None), times=True).times is False
    assert next(iter(ScoringStream(src, vocab, Schema()))).times is None  # not asked for


def test_recommend_file_reads_the_time_unit_and_refuses_milliseconds_read_as_seconds(pipes, tmp_path: Path) -> None:
    src = tmp_path / "ms.parquet"
    write_sessions(src, list(NOWS), "lists", unit=1000.0)
    with pytest.raises(ValueError, match=r"ms.parquet: column 'timestamp' has the time [\d.]+ at row \d+, read with "
                                         r"time_unit: s as the year [\d,]+ \(outside 1990..2100\); .*set time_unit: ms"):
        recommend_file(pipes["deny"], src, tmp_path / "recs.parquet", k=K)
    recommend_file(pipes["deny"], src, tmp_path / "recs.parquet", k=K, schema=Schema(time_unit="ms"))
    assert recommended(tmp_path / "recs.parquet") == [EXPECTED["deny"][now] for now in NOWS]


def test_recommend_file_without_a_time_column_serves_at_one_now(pipes, tmp_path: Path) -> None:
    src = tmp_path / "sessions.parquet"
    write_sessions(src, list(NOWS), "none")
    for now in NOWS:
        counts = recommend_file(pipes["deny"], src, tmp_path / "recs.parquet", k=K, now=now, overwrite=True)
        assert counts["now"] == now
        assert recommended(tmp_path / "recs.parquet") == [EXPECTED["deny"][now]] * 4
    with pytest.raises(ValueError, match=r"now 1700000000000 is not a time in seconds .*year 3000"):
        recommend_file(pipes["deny"], src, tmp_path / "ms.parquet", now=1_700_000_000_000)


def kill_after_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    real, calls = Pipeline.recommend_batch, []

    def killed(self, sessions, k=20):
        if calls:
            raise RuntimeError("killed")
        calls.append(len(sessions))
        return real(self, sessions, k)

    monkeypatch.setattr(Pipeline, "recommend_batch", killed)


def test_a_resumed_run_serves_at_the_time_the_run_started_and_another_now_starts_over(
    pipes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    src, out = tmp_path / "sessions.parquet", tmp_path / "recs.parquet"
    write_sessions(src, list(NOWS), "none")
    pipe = pipes["deny"]
    monkeypatch.setattr(pipe, "content_hash", "sha256:test", raising=False)  # as if loaded: its parts may be resumed
    with monkeypatch.context() as patch:
        at_clock(patch, offline, T0)  # the run starts inside the window
        kill_after_one_batch(patch)
        with pytest.raises(RuntimeError, match="killed"):
            recommend_file(pipe, src, out, k=K, batch_size=2, partition_batches=1)
    manifest = json.loads((tmp_path / "recs.parquet.parts" / "manifest.json").read_text())
    assert manifest["now"] == T0
    at_clock(monkeypatch, offline, T1)  # resumed after the window closed: still served at T0
    counts = recommend_file(pipe, src, out, k=K, batch_size=2, partition_batches=1)
    assert (counts["partitions_written"], counts["partitions_resumed"], counts["now"]) == (1, 1, T0)
    assert recommended(out) == [EXPECTED["deny"][T0]] * 4
    with monkeypatch.context() as patch:
        kill_after_one_batch(patch)
        with pytest.raises(RuntimeError, match="killed"):
            recommend_file(pipe, src, out, k=K, batch_size=2, overwrite=True, now=T0, partition_batches=1)
    counts = recommend_file(pipe, src, out, k=K, batch_size=2, overwrite=True, now=T1, partition_batches=1)  # another now
    assert (counts["partitions_written"], counts["partitions_resumed"]) == (2, 0)
    assert "starting over" in capsys.readouterr().out
    assert recommended(out) == [EXPECTED["deny"][T1]] * 4


def test_recommend_file_refuses_an_input_without_times_for_a_ranker_that_reads_them(pipes, tmp_path: Path) -> None:
    src = tmp_path / "sessions.parquet"
    write_sessions(src, [T0], "none")
    with pytest.raises(ValueError, match=r"sessions.parquet: the pipeline's ranker was fitted with time features "
                                         r"\(session_duration, .*\): give every session's event times \(column "
                                         r"'timestamp'\); the file has columns \['session_id', 'item_id'\]"):
        recommend_file(with_time_features(pipes["plain"]), src, tmp_path / "recs.parquet", k=K)
    assert not (tmp_path / "recs.parquet").exists() and not (tmp_path / "recs.parquet.parts").exists()


def test_a_list_of_one_time_per_session_is_refused(vocab: ItemVocab, tmp_path: Path) -> None:
    src = tmp_path / "sessions.parquet"
    pq.write_table(pa.table({"session_id": [1], "item_id": [[20, 10]], "timestamp": [T0]}), src)
    with pytest.raises(SchemaError, match="column 'timestamp' holds one value per session; give a list of event times"):
        list(ScoringStream(src, vocab, Schema(), times=True))


def test_recommend_file_refuses_an_output_it_cannot_write_before_writing_anything(pipes, tmp_path: Path) -> None:
    src = tmp_path / "sessions.parquet"
    write_sessions(src, list(NOWS), "lists")
    (tmp_path / "out").mkdir()
    cases = [
        (tmp_path / "recs.parquet", 0, r"k must be an integer of 1 or more, got 0"),
        (tmp_path / "out", K, r"--output .*out is a directory; name a file in it \(e.g. .*out/recs.parquet\)"),
        (tmp_path / "recs.txt", K, r"--output .*recs.txt: unknown extension '.txt'; name a .parquet or .pq file .* or a .csv file"),
    ]
    for output, k, message in cases:
        with pytest.raises(ValueError, match=message):
            recommend_file(pipes["deny"], src, output, k=k)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "sessions.parquet"]  # no .parts, no temporary file
    assert not any((tmp_path / "out").iterdir())


def test_recommend_file_writes_csv_for_a_csv_output(pipes, tmp_path: Path) -> None:
    src = tmp_path / "sessions.parquet"
    write_sessions(src, list(NOWS), "lists")
    recommend_file(pipes["deny"], src, tmp_path / "recs.csv", k=K, batch_size=3)
    table = pacsv.read_csv(tmp_path / "recs.csv")
    assert table.column_names == ["session_id", "rank", "item_id", "score"]
    expected = [(sid, rank, item) for sid, now in enumerate(NOWS, 1) for rank, item in enumerate(EXPECTED["deny"][now], 1)]
    assert list(zip(*(table.column(c).to_pylist() for c in ("session_id", "rank", "item_id")))) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recs.csv", "sessions.parquet"]


# --------------------------------------------------------------------- relative times against dated windows
RELATIVE = r"is served at 35 s, a relative time \(before 1990\), but the {mode} table .*{mode}.parquet has a validity " \
           r"window bound at 2023-11-14 22:13:20 UTC, a date, so no window of it would ever hold"


@pytest.mark.parametrize("mode", ["deny", "allow"])
def test_relative_event_times_against_dated_windows_are_refused_in_every_path(
    pipes, mode: str, tmp_path: Path
) -> None:
    """Sessions whose times count from their start (before 1990) are served at their last event; no dated window
    holds then, so the table would silently be absent (deny) or empty (allow): every entry point refuses."""
    with pytest.raises(ValueError, match="session 0 " + RELATIVE.format(mode=mode)):
        pipes[mode].recommend([SESSION], k=K, times=[[35.0]])
    with TestClient(build_app(pipes[mode], max_wait_ms=1.0)) as client:
        reply = client.post("/recommend", json={"session": SESSION, "k": K, "times": [35.0]})
        assert reply.status_code == 422
        assert re.fullmatch("session 0 " + RELATIVE.format(mode=mode) + ".*", reply.json()["error"])
        # the request after it is served (the refusal is the request's, not its batch's)
        assert ids(client.post("/recommend", json={"session": SESSION, "k": K, "now": T0}).json()["recommendations"]) \
            == [EXPECTED[mode][T0]]
    src = tmp_path / "relative.parquet"
    pq.write_table(pa.table({"session_id": ["a"], "item_id": [[10, 10]], "timestamp": [[5.0, 35.0]]}), src)
    with pytest.raises(ValueError, match=r"relative.parquet: session 'a' " + RELATIVE.format(mode=mode)):
        recommend_file(pipes[mode], src, tmp_path / "recs.parquet", k=K)
    assert not (tmp_path / "recs.parquet").exists()
    # a `now` of the tables' frame serves the same sessions; so does a pipeline without a table
    assert ids(pipes[mode].recommend([SESSION], k=K, times=[[35.0]], now=T0)) == [EXPECTED[mode][T0]]
    recommend_file(pipes[mode], src, tmp_path / "recs.parquet", k=K, now=T0)
    assert recommended(tmp_path / "recs.parquet") == [EXPECTED[mode][T0]]
    assert ids(pipes["plain"].recommend([SESSION], k=K, times=[[35.0]])) == [BASE[:K]]


def test_dated_requests_against_a_table_of_relative_windows_are_refused(vocab: ItemVocab, tmp_path: Path) -> None:
    relative = table(tmp_path / "relative.parquet", item_id=[70], valid_from=[0.0], valid_to=[3600.0])
    open_ended = table(tmp_path / "open.parquet", item_id=[70])
    pipe = build(vocab, [ItemTableFilter(relative, mode="deny")])
    assert ids(pipe.recommend([SESSION], k=K, times=[[35.0]])) == [BASE[1:K + 1]]  # 70 denied in its first hour
    assert ids(pipe.recommend([SESSION], k=K, times=[[3600.0]])) == [BASE[:K]]
    with pytest.raises(ValueError, match=r"session 1 is served at 2023-11-14 22:13:20 UTC, but the deny table "
                                         r".*relative.parquet has a validity window bound at 3600 s, a relative time"):
        pipe.recommend([SESSION, SESSION], k=K, times=[[35.0], [T0]])
    # a table without windows holds at any time, relative or dated
    pipe = build(vocab, [ItemTableFilter(open_ended, mode="deny")])
    assert ids(pipe.recommend([SESSION, SESSION], k=K, now=[35.0, T0])) == [BASE[1:K + 1]] * 2
