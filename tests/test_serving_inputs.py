"""Request bodies the server must refuse by name rather than answer for one reading of them: a field given twice,
two sessions under one id, unknown fields, bad ids and bad k (`sessrec.serving.request.parse_request`), on the tiny
co-visitation pipeline of `tests/test_serve.py`, through FastAPI's TestClient."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient

from sessrec.data import SyntheticSource
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.serving.app import build_app
from sessrec.tasks import SessionDataModule

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pipe() -> Pipeline:
    data = SessionDataModule(source=SyntheticSource(num_sessions=400, num_items=60, days=10), max_length=10)
    train, _ = data.tensors("train")
    return Pipeline(data.vocab, {"covisitation": (CoVisitation().fit(train, data.num_items), 20)}, max_length=10,
                    max_candidates=20)


@pytest.fixture(scope="module")
def client(pipe: Pipeline) -> Iterator[TestClient]:
    with TestClient(build_app(pipe, max_batch_size=8, max_wait_ms=1.0)) as c:
        yield c


def refused(client: TestClient, body: bytes) -> tuple[int, str]:
    reply = client.post("/recommend", content=body, headers={"content-type": "application/json"})
    return reply.status_code, reply.json().get("error", reply.json())


@pytest.mark.parametrize("body, message", [
    (b'{"session": [1031], "k": 3, "k": 5}', 'field "k" is given twice (3, then 5); give each field once'),
    (b'{"session": [1031], "k": 3, "k": 5, "k": 7}', 'field "k" is given 3 times (3, then 5, then 7); give each field once'),
    (b'{"session": [1031], "session": [1032]}', 'field "session" is given twice ([1031], then [1032]); give each field once'),
    (b'{"sessions": [[1031]], "on_unknown": "oov", "on_unknown": "error"}',
     "field \"on_unknown\" is given twice ('oov', then 'error'); give each field once"),
    (b'{"session": [1031], "k": 3, "\\u006b": 5}', 'field "k" is given twice (3, then 5); give each field once'),
    (b'{"session": [1031], "on_unknown": "oov", "on\\u005Funknown": "error"}',
     "field \"on_unknown\" is given twice ('oov', then 'error'); give each field once"),
    # the slow path of orjson's refusals (a 19-digit number) checks too
    (b'{"session": [1031], "now": 1000000000000000000, "now": 1}',
     'field "now" is given twice (1000000000000000000, then 1); give each field once'),
    # a session is a list of ids: an object is refused as such, whatever its keys
    (b'{"sessions": [{"item_ids": [1031], "item_ids": [1032]}]}', "session 0 must be a list of item ids, got dict"),
])
def test_a_field_given_twice_is_refused_naming_it_and_its_values(client, body: bytes, message: str) -> None:
    assert refused(client, body) == (422, message)


def test_bodies_that_only_look_like_repeating_a_field_are_answered(client, pipe) -> None:
    """An id spelled like a field, or an escape in an id, sends the body through the standard parser, which answers
    it as orjson does."""
    vocab_ids = pipe.vocab.raw_ids.slice(2, 2).to_pylist()
    body = ('{"sessions": [[%d], [%d]], "k": 3, "session_ids": ["k", "a\\"k\\""]}' % tuple(vocab_ids)).encode()
    reply = client.post("/recommend", content=body)
    assert reply.status_code == 200
    assert reply.json()["recommendations"] == pipe.recommend([[vocab_ids[0]], [vocab_ids[1]]], k=3)


@pytest.mark.parametrize("ids, message", [
    (["s1", "s2", "s1"], "session_ids: id 's1' is given twice, to session 0 ('s1') and session 2; each session "
                         "needs its own id"),
    ([7, "7", 8], "session_ids: id '7' is given twice, to session 0 (7) and session 1; each session needs its own id"),
])
def test_two_sessions_under_one_id_are_refused_naming_the_id_and_both_positions(client, ids, message) -> None:
    body = {"sessions": [[1031], [1032], [1033]], "k": 3, "session_ids": ids}
    reply = client.post("/recommend", json=body)
    assert (reply.status_code, reply.json()) == (422, {"error": message})


@pytest.mark.parametrize("body, message", [
    (b'{"session": [1031], "kk": 3}', "unknown field(s) ['kk']; the fields are ['k', 'now', 'on_unknown', 'session', "
                                      "'session_ids', 'sessions', 'times']; got \"kk\": 3"),
    (b'{"session": [1031], "K": 3, "item_ids": [5]}', "unknown field(s) ['K', 'item_ids']; the fields are ['k', 'now', "
     "'on_unknown', 'session', 'session_ids', 'sessions', 'times']; got \"K\": 3, \"item_ids\": [5]"),
    (b'{"session": [1031, true]}', "session 0: item ids must be strings or integers, got True"),
    (b'{"sessions": [[1031], [false]]}', "session 1: item ids must be strings or integers, got False"),
    (b'{"sessions": [[1031, "1032"]]}', "item ids of the request mix types: session 0, position 1 holds '1032' "
                                        "(str) where the first id 1031 is int; give every id of a request as the same type"),
    (b'{"sessions": [["1031"], [1032]]}', "item ids of the request mix types: session 1, position 0 holds 1032 "
                                          "(int) where the first id '1031' is str; give every id of a request as the same type"),
    (b'{"session": [1031], "k": 0}', "k must be an integer of 1 or more, got 0"),
    (b'{"session": [1031], "k": -2}', "k must be an integer of 1 or more, got -2"),
    (b'{"session": [1031], "k": 3.0}', "k must be an integer of 1 or more, got 3.0"),
    (b'{"session": [1031], "k": false}', "k must be an integer of 1 or more, got False"),
    (b'{"session": [1031], "now": Infinity}', "now inf is not a time in seconds since the epoch: infinite"),
    (b'{"session": [1031], "now": -Infinity}', "now -inf is not a time in seconds since the epoch: infinite"),
    (b'{"session": [1031], "times": [NaN]}', "session 0's event time nan is not a time in seconds since the epoch: "
                                            "not a number"),
    (b'{"session": [1031], "times": [Infinity]}', "session 0's event time inf is not a time in seconds since the "
                                                 "epoch: infinite"),
    (b'{"session": [1031, 1032], "times": [[1700000000, 1700000001]]}', 'times [[1700000000, 1700000001]]: with '
     '"session" (one session), times is one list of seconds, one per item id; a list per session goes with "sessions"'),
])
def test_unknown_fields_bool_ids_bad_k_and_bad_times_are_refused_naming_the_field_and_value(client, body, message) -> None:
    assert refused(client, body) == (422, message)


@pytest.mark.parametrize("settings, message", [
    ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1, got 0"),
    ({"max_batch_size": 2.5}, "max_batch_size must be an integer >= 1, got 2.5"),
    ({"max_wait_ms": float("nan")}, "max_wait_ms must be a finite number >= 0, got nan"),
    ({"max_wait_ms": -1.0}, "max_wait_ms must be a finite number >= 0, got -1.0"),
])
def test_build_app_refuses_batching_settings_as_sessrec_serve_does(pipe, settings, message) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        build_app(pipe, **settings)


def test_a_model_refused_at_load_leaves_no_served_log_folder(tmp_path, monkeypatch) -> None:
    """sessrec serve --served_log with a model directory whose weights hold a NaN (saved without the check): the
    one-line refusal of the weights, and no log folder created for a server that never started."""
    import numpy as np
    import pyarrow as pa

    import sessrec.artifacts.model_directory as model_directory
    from sessrec.data.vocab import ItemVocab
    from sessrec.models import CausalLanguageModeling, SASRecEncoder
    from sessrec.serving.server import serve
    from sessrec.tasks import NextItemTask

    torch.manual_seed(0)
    task = NextItemTask(num_items=12, max_length=5, encoder=SASRecEncoder(d_model=8, n_head=2, n_layer=1),
                        objective=CausalLanguageModeling()).eval()
    task.vocab = ItemVocab(pa.array(np.arange(100, 110)), np.ones(10, dtype=np.int64))
    with torch.no_grad():
        task.model.item_embedding.weight[4, 1] = float("nan")
    with monkeypatch.context() as patch:
        patch.setattr(model_directory, "check_finite", lambda weights, source: None)
        model_dir = task.recommender().save_pretrained(tmp_path / "model")
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'model\.item_embedding\.weight' holds nan at \[4, 1\]"):
        serve(str(model_dir), port=0, served_log=str(tmp_path / "logs" / "served"))
    assert not (tmp_path / "logs").exists()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


@pytest.mark.parametrize("body", [
    b'{"session": [1031], "k": ' + nested(1000) + b"}",  # orjson reads 1,024 levels; repr() of this one fails
    b'{"session": [' + nested(1000) + b"]}",
    b'{"sessions": [[1031], ' + nested(1000) + b"]}",
    b'{"session": [1031], "now": ' + nested(1000) + b"}",
    b'{"session": [1031], "times": [' + nested(1000) + b"]}",
    b'{"session": [1031], "session_ids": [' + nested(1000) + b"]}",
    b'{"session": [1031], "extra": ' + b'{"a": ' * 1000 + b"1" + b"}" * 1000 + b"}",
    b'{"session": [' + nested(5000) + b"]}",  # past what both parsers read
])
def test_a_value_nested_a_thousand_deep_is_a_400_and_the_next_request_is_answered(client, pipe, body: bytes) -> None:
    assert refused(client, body) == (
        400, "body nests arrays or objects too deeply to be read; a request nests them 3 deep at most")
    session = pipe.vocab.raw_ids.slice(2, 1).to_pylist()
    reply = client.post("/recommend", json={"session": session, "k": 3})
    assert reply.json()["recommendations"] == pipe.recommend([session], k=3)


LONG = "x" * 100_000
CUT = "'" + "x" * 56 + "..."  # clock.short of LONG: its repr cut to 60 characters


@pytest.mark.parametrize("body, message", [
    ({"session": [1031], "k": LONG}, f"k must be an integer of 1 or more, got {CUT}"),
    ({"session": [1031], "k": 10**4000}, f"k 1{'0' * 56}... is more than this server's limit of 100 (k_max)"),
    ({"session": [1031], "on_unknown": LONG}, f'on_unknown must be "oov" or "error", got {CUT}'),
    ({"session": [10**4000]}, f"session 0: item id 1{'0' * 56}... does not fit in a 64-bit integer"),
    ({"session": [LONG]}, "item ids of the request cannot be read as the vocabulary's int64 ids: item ids of type string "
                          f"cannot be matched with a vocabulary of int64: {CUT} is not a valid int64 id; give the ids "
                          "with the type the model was trained on"),
    ({"session": [1031, LONG]}, f"item ids of the request mix types: session 0, position 1 holds {CUT} (str) where the "
                                "first id 1031 is int; give every id of a request as the same type"),
    ({"session": ["0" * 5000 + "1"]}, "session 0, position 0: item id '" + "0" * 56 + "... is not written as the "
                                      "model's int64 ids are (no leading zeros, '+' or spaces): give '1' or 1"),
    ({"session": [" " + "9" * 30]}, "session 0, position 0: item id ' " + "9" * 30 + "' is not written as the model's "
                                    "int64 ids are (no leading zeros, '+' or spaces): and it does not fit in 64 bits"),
    ({"session": [1031], LONG: 1, "b": 2, "c": 3, "d": 4},
     "unknown field(s) ['b', 'c', 'd', '" + "x" * 40 + "...; the fields are ['k', 'now', 'on_unknown', 'session', "
     "'session_ids', 'sessions', 'times']; got \"b\": 2, \"c\": 3, \"d\": 4, and 1 more"),
])
def test_a_refusal_shows_a_long_value_cut_to_sixty_characters(client, body: dict, message: str) -> None:
    assert refused(client, json.dumps(body).encode()) == (422, message)


def test_an_unknown_id_under_on_unknown_error_is_shown_whole_and_a_long_query_parameter_cut(client) -> None:
    body = {"session": [1031, 10**18 + 7], "on_unknown": "error"}
    assert refused(client, json.dumps(body).encode()) == (422, "item id 1000000000000000007 is not in the model's "
                                                               "vocabulary")
    reply = client.post(f"/recommend?{'x' * 5000}=1", json={"session": [1031]})
    assert reply.status_code == 422
    assert reply.json()["error"] == (
        f"query parameter {CUT} of POST /recommend?{'x' * 57}... is not read: the settings are fields of the JSON "
        f"body (\"{'x' * 56}...: 1); the fields are ['k', 'now', 'on_unknown', 'session', 'session_ids', 'sessions', "
        "'times']")



FIELDS = "['k', 'now', 'on_unknown', 'session', 'session_ids', 'sessions', 'times']"


@pytest.mark.parametrize("query, message", [
    ("k=%C2%B2", "query parameter 'k' of POST /recommend?k=%C2%B2 is not read: the settings are fields of the JSON "
                 f'body ("k": "\\u00b2"); the fields are {FIELDS}'),  # "²".isdigit(), which int() does not read
    ("k=" + "9" * 5000, f"query parameter 'k' of POST /recommend?k={'9' * 55}... is not read: the settings are fields "
                        f'of the JSON body ("k": "{"9" * 56}...); the fields are {FIELDS}'),
])
def test_a_query_value_int_cannot_read_is_a_422_naming_it(client, query: str, message: str) -> None:
    reply = client.post(f"/recommend?{query}", json={"session": [1031]})
    assert (reply.status_code, reply.json()) == (422, {"error": message})


@pytest.mark.parametrize("number", ["9" * 5000, "-" + "9" * 5000])
def test_an_integer_past_what_int_reads_is_a_422_not_invalid_json(client, pipe, number: str) -> None:
    for body in ('{"session": [%s]}' % number, '{"session": [1031], "k": %s}' % number):
        assert refused(client, body.encode()) == (422, f"body holds an integer of 5000 digits ({number[:12]}...); no "
                                                       "field of a request takes one: item ids fit in 64 bits")
    session = pipe.vocab.raw_ids.slice(2, 1).to_pylist()
    assert client.post("/recommend", json={"session": session}).status_code == 200


ROUTES = "the routes are POST /recommend, GET /health, GET /metadata, GET /metrics"


@pytest.mark.parametrize("method, path, status, message, allow", [
    ("GET", "/recommend", 405, f"method GET is not allowed on /recommend: use POST; {ROUTES}", "POST"),
    ("PUT", "/recommend", 405, f"method PUT is not allowed on /recommend: use POST; {ROUTES}", "POST"),
    ("POST", "/health", 405, f"method POST is not allowed on /health: use GET; {ROUTES}", "GET"),
    ("GET", "/recommendations", 404, f"no route GET /recommendations; {ROUTES}", None),
    ("POST", "/Recommend", 404, f"no route POST /Recommend; {ROUTES}", None),
])
def test_a_wrong_method_or_path_is_refused_as_every_refusal_is(client, method, path, status, message, allow) -> None:
    reply = client.request(method, path, json={"session": [1031]})
    assert (reply.status_code, reply.json()) == (status, {"error": message})
    assert reply.headers.get("allow") == allow


@pytest.mark.parametrize("encoding", ["gzip", "br, gzip"])
def test_a_compressed_body_is_a_415_naming_its_encoding(client, encoding: str) -> None:
    body = gzip.compress(b'{"session": [1031], "k": 3}')
    reply = client.post("/recommend", content=body, headers={"content-encoding": encoding})
    assert (reply.status_code, reply.json()) == (
        415, {"error": f"Content-Encoding '{encoding}' is not read: send the JSON body uncompressed"})
    plain = client.post("/recommend", content=gzip.decompress(body), headers={"content-encoding": "identity"})
    assert plain.status_code == 200


@pytest.mark.parametrize("body, message", [
    (b'{"session": [1031]' + b', "k": 1' * 100_000 + b"}",
     'field "k" is given 100000 times (1, then 1, then 1, then 99997 more); give each field once'),
    (b'{"session": [1031], "' + b"y" * 1000 + b'": 1, "' + b"y" * 1000 + b'": 2, "k": 3, "k": 4}',
     'field "' + "y" * 56 + "... is given twice (1, then 2); give each field once"),
])
def test_a_field_given_many_times_or_a_long_one_twice_is_named_in_one_short_line(client, body, message) -> None:
    assert refused(client, body) == (422, message)


@pytest.mark.parametrize("body", [b"", b" \r\n\t"])
def test_an_empty_body_is_a_400_saying_so(client, body: bytes) -> None:
    assert refused(client, body) == (400, 'body is empty: send a JSON object, such as {"session": [item ids], "k": 20}')
