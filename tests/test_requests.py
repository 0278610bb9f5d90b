"""One request validator for every way in: the server and the Python entry points accept and refuse alike.

A tiny world over one vocabulary (raw ids 10..70): a co-visitation pipeline, and a session model
(an untrained GRU4Rec, d_model 8) saved as a model directory and loaded as the server loads it
(`load_recommender`: a `SessionModelService`). Each is served by the app in process (TestClient)
and called in Python (`recommend`). The hand-written cases: requests the server refuses, each
refused by both Python calls with the server's message; the property test draws random requests, valid and not,
and checks that the server and the Python call of each model accept the same ones (with the same
lists) and refuse the same ones (the server with 422, Python with a ValueError or TypeError, both
with the same one-line message).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from sessrec.artifacts.session_recommender import Inference, SessionRecommender
from sessrec.data.vocab import ItemVocab
from sessrec.models import CausalLanguageModeling, GRU4RecEncoder, SessionModel
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.serving.app import build_app
from sessrec.serving.recommender import load_recommender
from sessrec.serving.request import Limits

torch.set_num_threads(1)
IDS = [10, 20, 30, 40, 50, 60, 70]
T0 = 1_700_000_000.0
# generous bounds: the server's limits (413, k_max) are its own, the rules checked here are everyone's
LIMITS = Limits(max_sessions_per_request=1_000, max_items_per_session=1_000, k_max=2**80)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    vocab = ItemVocab(pa.array(IDS), np.array([21, 6, 5, 4, 3, 2, 1]))
    pairs = [[10, other] for n, other in enumerate(IDS[1:], start=1) for _ in range(n)]
    train = torch.from_numpy(vocab.encode(pa.array(np.ravel(pairs))).ids.reshape(-1, 2))
    pipe = Pipeline(vocab, {"covisitation": (CoVisitation().fit(train, len(vocab)), 10)}, max_length=4,
                    history_length=8, max_candidates=10)
    torch.manual_seed(0)
    network = SessionModel(len(vocab), GRU4RecEncoder(d_model=8), max_length=5).eval()
    directory = SessionRecommender(network, CausalLanguageModeling(), vocab, Inference(max_length=5)).save_pretrained(
        tmp_path_factory.mktemp("model") / "model")
    return {"pipeline": pipe, "model": load_recommender(directory)}


@pytest.fixture(scope="module")
def clients(models: dict):
    with TestClient(build_app(models["pipeline"], max_wait_ms=1.0, limits=LIMITS)) as p, \
            TestClient(build_app(models["model"], max_wait_ms=1.0, limits=LIMITS)) as m:
        yield {"pipeline": p, "model": m}


def served(client: TestClient, body: dict) -> tuple[str, object]:
    """The server's answer: ("ok", lists) or ("refused", message); anything else fails the test."""
    reply = client.post("/recommend", content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    if reply.status_code == 200:
        return "ok", reply.json()["recommendations"]
    assert reply.status_code == 422, (reply.status_code, reply.text)
    return "refused", reply.json()["error"]


def called(model, body: dict) -> tuple[str, object]:
    """The Python call's answer, as `served` gives the server's."""
    kwargs = {name: value for name, value in body.items() if name != "sessions"}
    try:
        return "ok", model.recommend(body["sessions"], **kwargs)
    except (ValueError, TypeError) as err:
        return "refused", " ".join(str(err).split())


def assert_alike(server: tuple[str, object], python: tuple[str, object]) -> None:
    assert server[0] == python[0], (server, python)
    if server[0] == "refused":
        assert server[1] == python[1]
        assert "\n" not in server[1]
        return
    assert [r["item_ids"] for r in server[1]] == [r["item_ids"] for r in python[1]]
    for s, p in zip(server[1], python[1]):
        assert s["scores"] == pytest.approx(p["scores"], abs=1e-6)


# ------------------------------------------------------------------------------------- by hand
CASES = [
    ({"sessions": ["1020"]}, "session 0 must be a list of item ids, got str"),
    ({"sessions": "10 20"}, "sessions must be a non-empty list of sessions, each a list of item ids, got str"),
    ({"sessions": []}, "sessions must be a non-empty list of sessions, each a list of item ids, got an empty list"),
    ({"sessions": [[10, None]]}, "session 0: item ids must be strings or integers, got None"),
    ({"sessions": [[10], [True, 20]]}, "session 1: item ids must be strings or integers, got True"),
    ({"sessions": [[10, 2.0]]}, "session 0: item ids must be strings or integers, got 2.0"),
    ({"sessions": [["10"], ["20", "a\ud800"]]}, "session 1, position 1: item id 'a\\ud800' is not text (an unpaired surrogate)"),
    ({"sessions": [[10], []]}, "session 1 is empty: give at least one item id"),
    ({"sessions": [[10]], "k": 0}, "k must be an integer of 1 or more, got 0"),
    ({"sessions": [[10]], "k": -3}, "k must be an integer of 1 or more, got -3"),
    ({"sessions": [[10]], "k": 2.7}, "k must be an integer of 1 or more, got 2.7"),
    ({"sessions": [[10]], "k": True}, "k must be an integer of 1 or more, got True"),
    ({"sessions": [[10]], "k": "5"}, "k must be an integer of 1 or more, got '5'"),
    ({"sessions": [[10]], "on_unknown": "skip"}, 'on_unknown must be "oov" or "error", got \'skip\''),
    ({"sessions": [[10, 20]], "times": [[T0]]}, "times of session 0 has 1 values for its 2 item ids"),
    ({"sessions": [[10]], "times": [[T0 * 1000]]},
     ("session 0's event time 1700000000000 is not a time in seconds since the epoch: after the year 3000 "
      "(milliseconds? give seconds)")),
    ({"sessions": [[10, 20]], "times": [[T0, T0 - 1]]},
     "times of session 0 go back at position 1 (1699999999 after 1700000000): give each session's events oldest first"),
    ({"sessions": [[10, 20]], "times": [[T0, T0 + 600]], "now": T0},
     "now 1700000000 is 600 s before the last event of session 0 (1700000600): a session is served after its events"),
    ({"sessions": [[10]], "now": -1}, "now -1 is not a time in seconds since the epoch: before 1970 (negative)"),
    ({"sessions": [[10]], "now": [T0, T0]}, "now holds 2 times for 1 sessions: give one time, or one per session"),
    ({"sessions": [[10]], "now": [None]}, "now must be seconds since the epoch (a number, or one per session), got [None]"),
    ({"sessions": [[10]], "times": [[None]]}, "times of session 0 must be numbers (seconds since the epoch), got None"),
    ({"sessions": [[10]], "times": [[1e300]]},
     ("session 0's event time 100000000000... (301 digits) is not a time in seconds since the epoch: after the year 3000 "
      "(milliseconds? give seconds)")),
    ({"sessions": [[10]], "now": 1e300},
     "now 100000000000... (301 digits) is not a time in seconds since the epoch: after the year 3000 (milliseconds? give seconds)"),
]


@pytest.mark.parametrize(("body", "message"), CASES, ids=[m[:40] for _, m in CASES])
@pytest.mark.parametrize("kind", ["pipeline", "model"])
def test_the_python_api_refuses_what_the_server_refuses_with_its_message(models, clients, kind, body, message) -> None:
    assert served(clients[kind], body) == ("refused", message)
    assert called(models[kind], body) == ("refused", message)


@pytest.mark.parametrize("kind", ["pipeline", "model"])
def test_a_large_k_returns_what_there_is(models, clients, kind) -> None:
    body = {"sessions": [[10]], "k": 10**12}
    lists = served(clients[kind], body)
    assert lists[0] == "ok" and len(lists[1][0]["item_ids"]) == (6 if kind == "pipeline" else 7)
    assert_alike(lists, called(models[kind], body))


# ------------------------------------------------------------------------------------- drawn
ITEM = st.one_of(
    st.sampled_from(IDS), st.sampled_from([str(i) for i in IDS]), st.integers(-(2**70), 2**70), st.text(max_size=3),
    st.none(), st.booleans(), st.floats(), st.lists(st.integers(0, 80), max_size=2),
)
TIME = st.one_of(
    st.sampled_from([T0 - 600, T0 - 60, T0, T0 + 299, T0 + 400]), st.floats(), st.integers(-5, 2**70),
    st.booleans(), st.text(max_size=2), st.none(),
)


GOOD_ITEM = st.one_of(st.sampled_from(IDS), st.integers(0, 100))  # known ids, and unknown ones (scored as OOV)
GOOD_TIME = st.sampled_from([T0 - 600, T0 - 60, T0, T0 + 299, T0 + 400])


@st.composite
def bodies(draw) -> dict:
    """A request body, each field drawn well formed most of the time and anything now and then, so
    that every check is reached and most requests pass some of them."""

    def often(good: st.SearchStrategy, bad: st.SearchStrategy, odds: int = 4) -> object:
        return draw(bad) if draw(st.integers(0, odds)) == 0 else draw(good)

    session = st.lists(GOOD_ITEM, min_size=1, max_size=5)
    odd_session = st.one_of(ITEM, st.lists(st.one_of(GOOD_ITEM, ITEM), max_size=5))
    sessions = often(st.lists(session, min_size=1, max_size=3),
                     st.one_of(ITEM, st.lists(st.one_of(session, odd_session), max_size=3)))
    body: dict = {"sessions": sessions}
    if draw(st.booleans()):
        body["k"] = often(st.integers(1, 12), st.one_of(st.integers(-3, 0), st.integers(2**40, 2**70), st.floats(),
                                                        st.booleans(), st.none(), st.text(max_size=2)))
    if draw(st.integers(0, 3)) == 0:
        body["on_unknown"] = often(st.sampled_from(["oov", "error"]), ITEM)
    if draw(st.booleans()) and isinstance(sessions, list):
        lengths = [len(s) if isinstance(s, list) else 1 for s in sessions]
        if draw(st.integers(0, 5)) == 0:
            lengths = [max(n + draw(st.integers(-1, 1)), 0) for n in lengths]  # another length, now and then
        times = [sorted(draw(st.lists(GOOD_TIME, min_size=n, max_size=n))) for n in lengths]  # oldest first
        if draw(st.integers(0, 4)) == 0:  # a bad value somewhere, or times that go back
            times = [draw(st.lists(st.one_of(GOOD_TIME, TIME), min_size=n, max_size=n)) for n in lengths]
        body["times"] = often(st.just(times), st.one_of(ITEM, st.lists(ITEM, max_size=3)), odds=8)
    if draw(st.booleans()):
        body["now"] = often(GOOD_TIME, st.one_of(TIME, st.lists(st.one_of(GOOD_TIME, TIME), max_size=3)))
    return body


@settings(max_examples=100, deadline=None, derandomize=True, database=None)  # seeded; writes nothing
@given(body=bodies())
def test_the_server_and_python_accept_and_refuse_the_same_requests(models, clients, body: dict) -> None:
    for kind in ("pipeline", "model"):
        assert_alike(served(clients[kind], body), called(models[kind], body))
