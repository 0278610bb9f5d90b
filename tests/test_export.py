"""Export of every encoder and of DLRM (ONNX under onnxruntime, TorchScript under torch.jit.load), each checked
against eager PyTorch on a batch of another size and length than the export example; the refused pairs; the
Triton repository's config.pbtxt, parsed."""

import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from sessrec.artifacts import ClickRanker, Inference, SessionRecommender
from sessrec.cli import export as cli_export
from sessrec.data import ItemVocab
from sessrec.data.batch import SessionBatch
from sessrec.data.columns import SchemaError
from sessrec.data.side import SideFeatures, SideInfoSpec
from sessrec.datasets.clickout_rows import RankingLoader, RankingVocab
from sessrec.datasets.clickouts import DENSE_FEATURES, SPARSE_FEATURES
from sessrec.embeddings import DynamicTables, SparseFeatures, TableConfig
from sessrec.features import SideFeatureTransform
from sessrec.lifecycle.export import (
    export_dlrm,
    export_model_dir,
    export_session_model,
    max_abs_diff,
    run_exported,
)
from sessrec.lifecycle.scorers import ExportedClickScorer, NextItemScorer
from sessrec.lifecycle.triton import model_config, triton_repository
from sessrec.models import (
    BertEncoder,
    BSARecEncoder,
    CausalLanguageModeling,
    ElectraEncoder,
    GPT2Encoder,
    GRU4RecEncoder,
    HSTUEncoder,
    MaskedItemModeling,
    PermutationLanguageModeling,
    ReplacedTokenDetection,
    SASRecEncoder,
    XLNetEncoder,
)
from sessrec.models.dlrm import DLRM
from sessrec.models.objective import EVENT_TIMES
from sessrec.pipeline import RequestSessions
from sessrec.saved.versions import VersionedDirectory
from sessrec.serving.recommender import SessionModelService
from sessrec.tasks import DLRMTask, Evaluation, NextItemTask
from sessrec.tasks.settings import DLRMNetwork

MODELS = {  # each encoder with the objective it trains with
    "xlnet_mlm": (lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1), MaskedItemModeling),
    "xlnet_plm": (lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1), PermutationLanguageModeling),
    "bert_mlm": (lambda: BertEncoder(d_model=16, n_head=2, n_layer=1), MaskedItemModeling),
    "electra_rtd": (lambda: ElectraEncoder(d_model=16, n_head=2, n_layer=1), ReplacedTokenDetection),
    "gpt2_clm": (lambda: GPT2Encoder(d_model=16, n_head=2, n_layer=1), CausalLanguageModeling),
    "sasrec_clm": (lambda: SASRecEncoder(d_model=16, n_head=2, n_layer=1), CausalLanguageModeling),
    "gru4rec_clm": (lambda: GRU4RecEncoder(d_model=16), CausalLanguageModeling),
    "hstu_clm": (lambda: HSTUEncoder(d_model=16, n_head=2, n_layer=1), CausalLanguageModeling),
    "bsarec_mlm": (lambda: BSARecEncoder(d_model=16, n_head=2, n_layer=1, window=11), MaskedItemModeling),
}
REFUSED = {("gru4rec_clm", "onnx")}
EXPORTS = [(m, f) for m in MODELS for f in ("onnx", "torchscript") if (m, f) not in REFUSED]


def session_task(name: str, **kwargs) -> NextItemTask:
    torch.manual_seed(0)
    encoder, objective = MODELS[name]
    task = NextItemTask(num_items=50, max_length=10, encoder=encoder(), objective=objective(), **kwargs).eval()
    task.vocab = ItemVocab(pa.array(np.arange(48)), np.ones(48, dtype=np.int64))  # 48 items, padding and OOV
    return task


def side_task(name: str, side: SideFeatures, **kwargs) -> NextItemTask:
    """`session_task` of a model that reads `side`, with its transforms fitted on `raw_sessions` (items 100..129 among
    the vocabulary's raw ids)."""
    transform = SideFeatureTransform(side).fit(raw_sessions(80, seed=0))
    task = session_task(name, side_features=transform.spec, **kwargs)
    task.side_transform, task.side_config = transform, side
    return task


def sessions(batch: int, length: int, seed: int) -> torch.Tensor:
    """(B, L) right-aligned sessions of 1..L items; the export example is (3, 6), these are not."""
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(2, 50, (batch, length), generator=g)
    sizes = torch.arange(batch) % length + 1
    return items.masked_fill(torch.arange(length) < (length - sizes).unsqueeze(1), 0)


def event_times(items: torch.Tensor, seed: int) -> torch.Tensor:
    """(B, L) float64 seconds rising along each session by gaps of 1 s to ~3 days."""
    g = torch.Generator().manual_seed(seed)
    return 1.7e9 + torch.exp(torch.rand(items.shape, generator=g, dtype=torch.float64) * 12.5).cumsum(1)


@pytest.mark.slow
@pytest.mark.parametrize("name,fmt", EXPORTS)
def test_session_model_matches_eager_on_other_shapes(tmp_path, name, fmt):
    task = session_task(name)
    path = export_session_model(task.recommender(), tmp_path, fmt, top_k=20)
    items = sessions(7, 13, seed=1)  # longer than max_length too: the latest items are kept
    times = event_times(items, seed=1) if task.model.uses_times else None  # HSTU reads them
    scores, top_scores, top_items = run_exported(path, items, *([] if times is None else [times]))
    with torch.no_grad():
        features = None if times is None else {EVENT_TIMES: times}
        expected = task.model(items, task.objective, features)  # (B, V), as evaluation reads it
        top = task.predict_step(SessionBatch(items=items, times=times), 0)
    assert scores.shape == (7, 50) and top_items.shape == (7, 20) and top_items.dtype == np.int64
    assert max_abs_diff(scores, expected.numpy()) <= 1e-4
    np.testing.assert_array_equal(top_items, top.items.numpy())
    np.testing.assert_allclose(top_scores, top.scores.numpy(), atol=1e-4)


def test_description_beside_the_model(tmp_path):
    path = export_session_model(session_task("sasrec_clm").recommender(), tmp_path, "torchscript", top_k=5)
    spec = json.loads(path.with_suffix(".json").read_text())
    assert spec["file"] == "model.pt" and spec["format"] == "torchscript" and spec["opset"] is None
    assert spec["inputs"] == [{"name": "items", "dtype": "int64", "shape": ["batch", "length"]}]
    assert [(o["name"], o["dtype"], o["shape"]) for o in spec["outputs"]] == [
        ("scores", "float32", ["batch", 50]), ("top_scores", "float32", ["batch", 5]), ("top_items", "int64", ["batch", 5]),
    ]
    assert spec["notes"]["encoder"] == "SASRecEncoder" and spec["notes"]["max_length"] == 10


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_side_features_are_inputs_and_exclude_seen_is_applied(tmp_path, fmt):
    task = side_task("bert_mlm", SideFeatures(categorical=["device"], continuous=["price"], time=["dwell"], nulls="pad"),
                     evaluation=Evaluation(exclude_seen=True))
    path = export_session_model(task.recommender(), tmp_path, fmt)
    items = sessions(5, 9, seed=2)
    g = torch.Generator().manual_seed(3)
    ids = task.model.side_info.categorical["device"].num_embeddings
    device, price, dwell = torch.randint(1, ids, items.shape, generator=g), torch.randn(items.shape, generator=g), torch.rand(items.shape, generator=g)
    (scores,) = run_exported(path, items, device, price, dwell)
    with torch.no_grad():
        batch = SessionBatch(items=items, features={"device": device, "price": price, "dwell": dwell})
        top = task.predict_step(batch, 0)
    assert np.isneginf(np.take_along_axis(scores, items.numpy(), axis=1)).all()  # seen items never recommended
    np.testing.assert_array_equal(np.argsort(-scores, axis=1, kind="stable")[:, :20], top.items.numpy())
    assert [t["name"] for t in json.loads(path.with_suffix(".json").read_text())["inputs"]] == ["items", "device", "price", "dwell"]


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_session_longer_than_the_model_reads_excludes_only_the_items_it_reads(tmp_path, fmt):
    """As served: a session is cut to its latest max_length items (10) before it is scored, so an item seen
    only before them is recommendable."""
    task = session_task("sasrec_clm", evaluation=Evaluation(exclude_seen=True))
    recommender = task.recommender()
    path = export_session_model(recommender, tmp_path, fmt, top_k=20)
    items = torch.randint(2, 50, (7, 13), generator=torch.Generator().manual_seed(1))  # 13 items each
    window = items[:, -10:]
    scores, _, top_items = run_exported(path, items)
    with torch.no_grad():
        expected = recommender.scores(window)  # what the server scores: the latest max_length items
        assert torch.equal(recommender.scores(items), expected)
    assert max_abs_diff(scores, expected.numpy()) <= 1e-4
    np.testing.assert_array_equal(top_items, expected.topk(20).indices.numpy())
    early = [(row, int(item)) for row in range(7) for item in items[row, :3] if item > 0 and item not in window[row]]
    assert early and all(np.isfinite(scores[row, item]) for row, item in early)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_model_served_on_fewer_items_than_its_network_reads_exports_reading_as_many(tmp_path, fmt):
    """Inference settings of 4 items on a network of 10: the file reads (and excludes) the latest 4, as served."""
    trained = session_task("sasrec_clm").recommender()
    recommender = SessionRecommender(trained.model, trained.objective, trained.vocab, Inference(4, exclude_seen=True))
    path = export_session_model(recommender, tmp_path, fmt, top_k=5)
    items = sessions(6, 9, seed=3)
    scores, _, top_items = run_exported(path, items)
    served = SessionModelService(recommender).recommend_batch(RequestSessions(items), 5)
    with torch.no_grad():
        assert max_abs_diff(scores, recommender.scores(items).numpy()) <= 1e-5
    np.testing.assert_array_equal(top_items, served.items.numpy())
    assert json.loads(path.with_suffix(".json").read_text())["notes"]["max_length"] == 4


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_top_k_past_what_a_session_can_be_recommended_ends_in_padding_as_served(tmp_path, fmt):
    """exclude_seen and a top_k of every product (48): a session of 3 items has 45 left; the slots past them hold
    id 0 (padding, -inf), as `SessionModelService` returns them, never a seen item or OOV scored -inf."""
    recommender = session_task("sasrec_clm", evaluation=Evaluation(exclude_seen=True)).recommender()
    path = export_session_model(recommender, tmp_path, fmt, top_k=50)
    items = torch.tensor([[0, 0, 5, 9, 17], [4, 4, 4, 4, 4]])
    _, top_scores, top_items = run_exported(path, items)
    served = SessionModelService(recommender).recommend_batch(RequestSessions(items), 50)
    assert top_items.shape == (2, 48) and (top_items[0, 45:] == 0).all() and (top_items[1, 47:] == 0).all()
    np.testing.assert_array_equal(top_items, served.items.numpy())
    np.testing.assert_allclose(top_scores, served.scores.numpy(), atol=1e-4)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_event_times_are_an_input_of_a_model_that_reads_them(tmp_path, fmt):
    task = session_task("hstu_clm")
    with torch.no_grad():  # a trained time bias: the initial one is zero and would read no times
        for layer in task.model.encoder.layers:
            layer.time_bias.normal_(generator=torch.Generator().manual_seed(4))
    path = export_session_model(task.recommender(), tmp_path, fmt, top_k=5)
    spec = json.loads(path.with_suffix(".json").read_text())
    assert spec["inputs"][1] == {"name": "event_times", "dtype": "float64", "shape": ["batch", "length"]}
    items = sessions(6, 8, seed=7)
    times = event_times(items, seed=8)
    scores, _, top_items = run_exported(path, items, times)
    with torch.no_grad():
        expected = task.predict_step(SessionBatch(items=items, times=times), 0)
        timed, untimed = task.model(items, task.objective, {EVENT_TIMES: times}), task.model(items, task.objective)
    assert max_abs_diff(scores, timed.numpy()) <= 1e-4
    np.testing.assert_array_equal(top_items, expected.items[:, :5].numpy())
    assert max_abs_diff(scores, untimed.numpy()) > 1e-2  # the times are read, not a constant of the trace
    (moved,) = run_exported(path, items, event_times(items, seed=9))[:1]  # other gaps: other scores
    assert max_abs_diff(moved, scores) > 1e-3
    with pytest.raises(ValueError, match="expected the inputs items, event_times; got 1 tensors"):
        NextItemScorer(task.recommender())(items)
    config = parse_pbtxt(model_config("hstu", spec, 8, 100))
    assert config["input"][1] == {"name": "event_times", "data_type": "TYPE_FP64", "dims": [-1]}


def test_a_torchscript_export_refuses_inputs_of_another_dtype_than_its_description(tmp_path):
    """torch.tensor of Python floats is float32: epoch seconds there are multiples of 128 s, which the traced HSTU
    read into other time buckets (other scores, no error). The file refuses an input of another dtype, as ONNX does."""
    task = session_task("hstu_clm")
    with torch.no_grad():
        for layer in task.model.encoder.layers:
            layer.time_bias.normal_(generator=torch.Generator().manual_seed(4))
    path = export_session_model(task.recommender(), tmp_path, "torchscript", top_k=5)
    module = torch.jit.load(str(path))
    items = sessions(4, 6, seed=7)
    times = event_times(items, seed=8)
    with torch.no_grad():
        module(items, times)  # float64 seconds, as model.json records
        with pytest.raises(Exception, match="input event_times must be float64"):
            module(items, times.float())
        with pytest.raises(Exception, match="input items must be int64"):
            module(items.int(), times)


def test_time_gaps_of_a_power_of_two_seconds_fall_in_the_buckets_eager_reads(tmp_path):
    """Whole-second logs have gaps of exactly 2, 4, 256 s: ONNX Runtime's Log2 comes out just below the integer
    there, which put each such gap one time bucket lower than PyTorch (other scores, exit 0)."""
    task = session_task("hstu_clm")
    with torch.no_grad():  # a trained time bias, one value per bucket
        for layer in task.model.encoder.layers:
            layer.time_bias.copy_(torch.arange(32, dtype=torch.float32)[:, None].expand(32, 2))
    recommender = task.recommender()
    path = export_session_model(recommender, tmp_path, "onnx", top_k=5)
    items = torch.tensor([[7, 8, 9, 10, 11], [0, 12, 13, 14, 15]])
    times = 1.7e9 + torch.tensor([[0, 2, 6, 262, 774], [0, 0, 1, 5, 1029]], dtype=torch.float64)  # gaps 2, 4, 256, 512, 1024
    scores, _, top_items = run_exported(path, items, times)
    with torch.no_grad():
        expected = recommender.scores(items, {EVENT_TIMES: times})
    assert max_abs_diff(scores, expected.numpy()) <= 1e-5
    np.testing.assert_array_equal(top_items, expected.topk(5).indices.numpy())


def test_gru4rec_to_onnx_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match=r"GRU4RecEncoder cannot be exported to onnx: .*pack_padded_sequence.*torchscript"):
        export_session_model(session_task("gru4rec_clm").recommender(), tmp_path, "onnx")
    assert not list(tmp_path.iterdir())


class DataDependentEncoder(nn.Module):
    """Branches in Python on the values of the mask: torch.export cannot follow it."""

    causal = False
    d_model = 16

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return embeddings * 2 if bool(attention_mask.all()) else embeddings


@pytest.mark.slow
def test_an_encoder_the_exporter_cannot_follow_gets_a_clear_error(tmp_path):
    task = session_task("bert_mlm")
    task.model.encoder = DataDependentEncoder()  # swapped in after the task is built: only export reads it
    with pytest.raises(ValueError, match=r"^DataDependentEncoder cannot be exported to onnx: "):
        export_session_model(task.recommender(), tmp_path, "onnx")
    with pytest.raises(ValueError, match="format must be one of"):
        export_session_model(task.recommender(), tmp_path, "tflite")


@pytest.mark.parametrize("blind_spot", ["longer than max_length", "unknown item", "top_items"])
def test_the_export_check_refuses_a_file_wrong_only_where_requests_differ_from_the_trace_example(tmp_path, monkeypatch,
                                                                                                  blind_spot):
    """The trace example has short sessions of known items: a file wrong only on a session longer than the model
    reads (cut as served), on one with an unknown id (OOV), or only in its ``top_items`` is refused by the check."""
    recommender = session_task("sasrec_clm").recommender()  # max_length 10
    forward = NextItemScorer.forward

    def wrong_in_the_file(self, items, *features):
        scores, values, top = forward(self, items, *features)
        if blind_spot == "longer than max_length" and items.shape[1] > self.model.max_length:  # a constant of the trace
            scores = scores + 1.0
        if blind_spot == "unknown item" and bool((items == 1).any()):
            scores = scores + 1.0
        if blind_spot == "top_items" and torch.jit.is_tracing():
            top = top.flip(1)
        return scores, values, top

    monkeypatch.setattr(NextItemScorer, "forward", wrong_in_the_file)
    with pytest.raises(RuntimeError, match=r"the exported SASRecEncoder \(torchscript\) differs from eager PyTorch"):
        export_session_model(recommender, tmp_path, "torchscript", top_k=5)
    assert not list(tmp_path.glob("model.*"))


def test_export_leaves_the_task_in_its_mode(tmp_path):
    task = session_task("sasrec_clm").train()
    export_session_model(task.recommender(), tmp_path, "torchscript")
    assert all(m.training for m in task.modules())


def test_an_export_in_the_other_format_replaces_the_earlier_one(tmp_path):
    """``model.json`` describes one export: a folder that held another run's export in the other format keeps
    no file of it, which would load as the model that ``model.json`` does not describe."""
    other = session_task("sasrec_clm")
    with torch.no_grad():
        other.model.item_embedding.weight.mul_(3.0)
    export_session_model(other.recommender(), tmp_path, "onnx")
    path = export_session_model(session_task("sasrec_clm").recommender(), tmp_path, "torchscript", top_k=5)
    assert path.name == "model.pt" and sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.pt", "vocab.parquet"]
    assert json.loads((tmp_path / "model.json").read_text())["file"] == "model.pt"
    export_session_model(other.recommender(), tmp_path, "onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.onnx", "vocab.parquet"]
    items = sessions(4, 7, seed=3)
    with torch.no_grad():
        expected = other.model(items, other.objective).numpy()
    assert max_abs_diff(run_exported(tmp_path / "model.onnx", items)[0], expected) <= 1e-4


def test_an_export_that_fails_leaves_the_earlier_export_whole(tmp_path, monkeypatch):
    """An exporter's error, and a file that differs from eager PyTorch, leave the folder as it was: the earlier
    export's file, vocabulary and model.json, byte for byte, and nothing else."""
    import sessrec.lifecycle.export as export

    export_session_model(session_task("sasrec_clm").recommender(), tmp_path, "torchscript", top_k=5)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["model.json", "model.pt", "vocab.parquet"]
    with pytest.raises(ValueError, match="GRU4RecEncoder cannot be exported to onnx"):
        export_session_model(session_task("gru4rec_clm").recommender(), tmp_path, "onnx")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    monkeypatch.setattr(export, "TOLERANCE", -1.0)  # every file differs from eager PyTorch by more
    with pytest.raises(RuntimeError, match=r"the exported .* \(torchscript\) differs from eager PyTorch"):
        export_session_model(session_task("bert_mlm").recommender(), tmp_path, "torchscript")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_export_stopped_among_its_moves_leaves_no_description_of_the_files_of_two_exports(tmp_path, monkeypatch):
    """Stopped after its model file was moved into place, an export left the earlier export's model.json (and vocabulary)
    beside the new model file: a folder that described another model than the one it held."""
    import sessrec.lifecycle.export as export

    export_session_model(session_task("sasrec_clm").recommender(), tmp_path, "torchscript", top_k=5)
    earlier = (tmp_path / "model.json").read_bytes()
    replace = os.replace

    def stopped(src, dst):
        if Path(dst) == tmp_path / "vocab.parquet":  # the move into the folder, not the write into the hidden one
            raise KeyboardInterrupt  # as a kill between two moves
        replace(src, dst)

    monkeypatch.setattr(export.os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        export_session_model(session_task("gpt2_clm").recommender(), tmp_path, "torchscript", top_k=3)
    monkeypatch.undo()
    assert not (tmp_path / "model.json").exists() and (tmp_path / "model.pt").read_bytes() != b""
    export_session_model(session_task("gpt2_clm").recommender(), tmp_path, "torchscript", top_k=3)  # the next export
    spec = json.loads((tmp_path / "model.json").read_text())
    assert (tmp_path / "model.json").read_bytes() != earlier and spec["outputs"][1]["shape"] == ["batch", 3]


def test_an_export_that_fails_into_a_new_folder_leaves_no_folder(tmp_path):
    """The folders an export created for its output (``out/a/b``) are removed again when it fails."""
    with pytest.raises(ValueError, match="GRU4RecEncoder cannot be exported to onnx"):
        export_session_model(session_task("gru4rec_clm").recommender(), tmp_path / "out" / "a", "onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("top_k", [0, -1, 2.5, True])
def test_a_top_k_that_is_no_count_is_refused_naming_it(tmp_path, top_k):
    with pytest.raises(ValueError, match=re.escape(f"top_k must be an integer of 1 or more, or None (scores only), "
                                                   f"got {top_k!r}")):
        export_session_model(session_task("sasrec_clm").recommender(), tmp_path / "out", "torchscript", top_k=top_k)
    assert list(tmp_path.iterdir()) == []


def test_sessrec_export_refuses_a_top_k_of_0_naming_it(tmp_path, sessrec_main):
    model_dir = session_task("sasrec_clm").recommender().save_pretrained(tmp_path / "model")
    got = sessrec_main("export", "--model_dir", str(model_dir), "--out", str(tmp_path / "out"), "--format", "torchscript",
                       "--top_k", "0")
    assert "top_k must be an integer of 1 or more, or None (scores only), got 0" in got
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["torchscript", "triton"])
def test_sessrec_export_refuses_a_top_k_for_a_click_ranker(tmp_path, sessrec_main, fmt):
    """A click ranker's export scores the rows it is given: --top_k was ignored, with exit 0."""
    model_dir = dlrm_task().ranker().save_pretrained(tmp_path / "model")
    for top_k in ("--top_k=5", "--top_k=null"):
        got = sessrec_main("export", "--model_dir", str(model_dir), "--out", str(tmp_path / "out"), "--format", fmt, top_k)
        assert got == (f"sessrec export: error: --top_k: a session model's setting (the K best items it outputs); {model_dir} "
                       "holds a click ranker, whose export scores the click-out rows it is given (logits) "
                       "(--traceback for details)")
    assert not (tmp_path / "out").exists()
    assert sessrec_main("export", "--model_dir", str(model_dir), "--out", str(tmp_path / "out"), "--format", fmt) == ""


def test_an_export_removes_the_hidden_folder_of_an_export_killed_on_this_host(tmp_path):
    """A SIGKILL leaves an export's hidden folder behind; the next export into the folder removes it when its
    process is gone, and leaves a live export's (this process's) and another host's alone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    killed, live, elsewhere = (tmp_path / f".export-{host}-{gone.pid}-x1", tmp_path / f".export-{host}-{os.getpid()}-x2",
                               tmp_path / ".export-another-host-1-x3")
    for stage in (killed, live, elsewhere):
        stage.mkdir()
        (stage / "model.onnx").write_bytes(b"half")
    export_session_model(session_task("sasrec_clm").recommender(), tmp_path, "torchscript", top_k=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, elsewhere.name, "model.json", "model.pt",
                                                                 "vocab.parquet"])


@pytest.mark.parametrize("kind", ["session", "dlrm"])
def test_export_from_a_model_directory(tmp_path, kind):
    task = session_task("sasrec_clm") if kind == "session" else dlrm_task()
    artifact = task.recommender() if kind == "session" else task.ranker()
    path = export_model_dir(artifact.save_pretrained(tmp_path / "model"), tmp_path / "out", "torchscript", top_k=20)
    if kind == "session":
        items = sessions(4, 7, seed=8)
        with torch.no_grad():
            expected = task.model(items, task.objective).numpy()
        assert max_abs_diff(run_exported(path, items)[0], expected) <= 1e-4
    else:
        scorer = ExportedClickScorer(task.ranker())
        inputs = scorer.example(5, 3, seed=9)
        with torch.no_grad():
            expected = scorer.eager(*inputs).numpy()
        assert max_abs_diff(run_exported(path, *inputs)[0], expected) <= 1e-5


def test_an_exports_folder_given_as_a_model_directory_is_refused_saying_what_it_is(tmp_path):
    from sessrec.serving.recommender import load_recommender

    model_dir = session_task("sasrec_clm").recommender().save_pretrained(tmp_path / "model")
    export_model_dir(model_dir, tmp_path / "out", "torchscript", top_k=5)
    message = (f"{tmp_path / 'out'}: holds an export (model.json, written by sessrec export for ONNX/TorchScript "
               "runtimes), not a model directory: give the model directory it was exported from (runs/<name>/model)")
    for read in (load_recommender, SessionRecommender.from_pretrained,
                 lambda folder: export_model_dir(folder, tmp_path / "again", "torchscript")):
        with pytest.raises(FileNotFoundError, match="^" + re.escape(message) + "$"):
            read(tmp_path / "out")
    assert not (tmp_path / "again").exists()


def test_an_export_carries_the_vocabulary_and_version_it_was_made_from(tmp_path):
    """An export is self-contained: its ``vocab.parquet`` is the exported version's, whatever the model directory
    makes current later, and ``model.json`` names that version and the vocabulary's fingerprint."""
    first, second = session_task("sasrec_clm"), session_task("sasrec_clm")
    second.vocab = ItemVocab(pa.array(np.arange(48)[::-1].copy()), np.ones(48, dtype=np.int64))  # other raw ids, same size
    model_dir = tmp_path / "model"
    first.recommender().save_pretrained(model_dir)
    second.recommender().save_pretrained(model_dir)  # a second save: versions, v000002 current
    path = export_model_dir(model_dir, tmp_path / "out", "torchscript", top_k=5)
    VersionedDirectory(model_dir).rollback()  # v000001 current again: the export stays v000002's
    assert (model_dir / "CURRENT").read_text().strip() == "v000001"
    spec = json.loads(path.with_suffix(".json").read_text())
    exported = ItemVocab.load(path.parent / spec["vocab"]["file"])
    assert exported == second.vocab and not exported == first.vocab
    assert spec["version"] == "v000002"
    assert spec["vocab"] == {"file": "vocab.parquet", "fingerprint": second.vocab.fingerprint(), "rows": 48}
    plain = export_model_dir(second.recommender().save_pretrained(tmp_path / "plain"), tmp_path / "out2", "torchscript")
    assert json.loads(plain.with_suffix(".json").read_text())["version"] is None
    pinned = export_model_dir(model_dir / "versions" / "v000002", tmp_path / "out3", "torchscript")  # a version's folder
    assert json.loads(pinned.with_suffix(".json").read_text())["version"] == "v000002"


def test_a_triton_export_carries_the_vocabulary_and_version(tmp_path):
    ranker = dlrm_task().ranker()
    model_dir = tmp_path / "model"
    ranker.save_pretrained(model_dir)
    ranker.save_pretrained(model_dir)
    written = Path(cli_export(str(model_dir), str(tmp_path / "repo"), "triton", name="dlrm"))
    spec = json.loads((written / "1" / "model.json").read_text())
    assert spec["version"] == "v000002" and spec["vocab"]["fingerprint"] == ranker.vocab.fingerprint()
    assert RankingVocab.load(written / "1" / "vocab.parquet").fingerprint() == ranker.vocab.fingerprint()


def test_a_triton_repository_inside_the_model_directory_is_refused_before_the_export(tmp_path, sessrec_main):
    """As ``--format onnx`` refuses it: a repository written into a version's folder would change a version in place."""
    model_dir = dlrm_task().ranker().save_pretrained(tmp_path / "model")
    for out in (model_dir / "repo", model_dir):
        got = sessrec_main("export", "--model_dir", str(model_dir), "--out", str(out), "--format", "triton")
        assert got == (f"sessrec export: error: --out {out} is inside {model_dir}, which the command reads; name another "
                       "folder (--traceback for details)")
    assert sorted(p.name for p in model_dir.iterdir()) == ["config.json", "model.safetensors", "vocab.parquet"]


@pytest.mark.parametrize("fmt", ["torchscript", "triton"])
def test_an_export_into_another_saved_model_directory_is_refused_and_leaves_it_whole(tmp_path, sessrec_main, fmt):
    """Another run's model directory as --out had its vocab.parquet replaced by the exported model's, with exit 0: the
    model in it no longer loaded."""
    model_dir = session_task("sasrec_clm").recommender().save_pretrained(tmp_path / "model")
    other = session_task("gpt2_clm")
    other.vocab = ItemVocab(pa.array(np.arange(100, 148)), np.ones(48, dtype=np.int64))
    versioned = tmp_path / "other"
    other.recommender().save_pretrained(versioned)
    other.recommender().save_pretrained(versioned)  # versions: CURRENT, versions/v000002
    before = {p: p.read_bytes() for p in versioned.rglob("*") if p.is_file()}
    for out, marker in ((versioned, "CURRENT"), (versioned / "versions" / "v000002", "config.json")):
        got = sessrec_main("export", "--model_dir", str(model_dir), "--out", str(out), "--format", fmt)
        assert got == (f"sessrec export: error: --out {out} is a saved model or pipeline directory (it holds {marker}): "
                       "the files written would replace its parts; name another folder (--traceback for details)")
    with pytest.raises(ValueError, match=rf"^out_dir {re.escape(str(versioned))} is a saved model or pipeline directory"):
        export_session_model(session_task("sasrec_clm").recommender(), versioned, "torchscript")
    assert {p: p.read_bytes() for p in versioned.rglob("*") if p.is_file()} == before
    assert SessionRecommender.from_pretrained(versioned).vocab == other.vocab


def ranking_vocab(values: int = 5) -> RankingVocab:
    """`values` raw values per feature of a click-out row: `values` + 2 ids each."""
    return RankingVocab({name: ItemVocab(pa.array([f"{name}{i}" for i in range(values)]), np.ones(values, dtype=np.int64))
                         for name in RankingVocab.empty().vocabs})


def dlrm_task(interaction: str = "dot") -> DLRMTask:
    """An untrained DLRM of a click-out row's features (7 ids each)."""
    torch.manual_seed(0)
    vocab = ranking_vocab()
    task = DLRMTask(cardinalities=vocab.cardinalities, num_dense=len(DENSE_FEATURES), network=DLRMNetwork(
        embedding_dim=4, dense_layers=[8, 4], over_layers=[8], interaction=interaction)).eval()
    task.vocab = vocab
    return task


@pytest.mark.slow
@pytest.mark.parametrize("interaction,fmt", [("dot", "onnx"), ("dot", "torchscript"), ("dcn", "torchscript")])
def test_dlrm_matches_eager_on_other_shapes(tmp_path, interaction, fmt):
    task = dlrm_task(interaction)
    path = export_dlrm(task.ranker(), tmp_path, fmt)
    g = torch.Generator().manual_seed(4)
    dense = torch.randn(9, len(DENSE_FEATURES), generator=g)
    ids = {name: torch.randint(0, 7, (9, 1), generator=g) for name in SPARSE_FEATURES}  # one-hot
    ids["filters"] = torch.randint(0, 7, (9, 5), generator=g).masked_fill(torch.rand(9, 5, generator=g) < 0.4, -1)  # multi-hot
    ids["filters"][0] = -1  # an empty bag
    (logits,) = run_exported(path, dense, *ids.values())
    with torch.no_grad():
        expected = task.model(dense, SparseFeatures.from_dense(ids))  # what DLRMTask feeds its batches to
    assert logits.shape == (9,)
    assert max_abs_diff(logits, expected.numpy()) <= 1e-5
    spec = json.loads(path.with_suffix(".json").read_text())
    assert [(t["name"], t["shape"]) for t in spec["inputs"]] == [
        ("dense", ["batch", 12]), *((name, ["batch", f"ids_{name}"]) for name in SPARSE_FEATURES)]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_dlrm_with_growing_tables_exports_its_rows_by_id(tmp_path, fmt):
    """A growing table is laid out by id for export: met ids give their rows, others count as absent (as in eval)."""
    torch.manual_seed(0)
    vocab = ranking_vocab(10)  # 12 ids a feature, in tables of 4 rows that grow
    task = DLRMTask(cardinalities={name: 4 for name in SPARSE_FEATURES}, num_dense=len(DENSE_FEATURES),
                    network=DLRMNetwork(embedding_dim=4, dense_layers=[8, 4], over_layers=[8]),
                    sparse=DynamicTables(lr=0.05))
    task.vocab = vocab
    met = {name: torch.tensor([[1], [6], [9]]) for name in SPARSE_FEATURES}
    met["filters"] = torch.tensor([[2, 3], [5, -1], [-1, -1]])
    task.train().model(torch.randn(3, len(DENSE_FEATURES)), SparseFeatures.from_dense(met))  # training inserts these ids
    task.eval()
    path = export_dlrm(task.ranker(), tmp_path, fmt)
    g = torch.Generator().manual_seed(4)
    dense = torch.randn(9, len(DENSE_FEATURES), generator=g)
    ids = {name: torch.randint(0, 12, (9, 2), generator=g) for name in met}  # met and never-met ids alike
    (logits,) = run_exported(path, dense, *ids.values())
    with torch.no_grad():
        expected = task.model(dense, SparseFeatures.from_dense(ids))
    assert max_abs_diff(logits, expected.numpy()) <= 1e-5
    # an id past the vocabulary's 12 is the unseen id 1 (which training met), not a never-met id's zeros
    past = run_exported(path, dense, *{**ids, "hotel": torch.full((9, 1), 12)}.values())[0]
    np.testing.assert_array_equal(past, run_exported(path, dense, *{**ids, "hotel": torch.full((9, 1), 1)}.values())[0])
    assert max_abs_diff(past, run_exported(path, dense, *{**ids, "hotel": torch.full((9, 1), 11)}.values())[0]) > 1e-6


def mean_pooled_growing_ranker() -> ClickRanker:
    """A click ranker whose growing tables met a few ids in training, `filters`' pooled by mean."""
    torch.manual_seed(0)
    tables = [TableConfig(name, 4, 4, pooling="mean" if name == "filters" else "sum") for name in SPARSE_FEATURES]
    model = DLRM(len(DENSE_FEATURES), tables, dense_layers=[8, 4], over_layers=[8], sparse=DynamicTables(optimizer="sgd"),
                 seed=0)
    met = {name: torch.tensor([[1], [6], [9]]) for name in SPARSE_FEATURES}
    met["filters"] = torch.tensor([[2, 3], [5, -1], [-1, -1]])
    model.train()(torch.randn(3, len(DENSE_FEATURES)), SparseFeatures.from_dense(met))  # training inserts these ids
    for table in model.sparse_arch.tables.values():
        table.weight.mul_(100)  # rows of a trained table's scale (they start within +-0.01)
    return ClickRanker(model.eval(), ranking_vocab(10))  # 12 ids a feature


def test_a_growing_mean_pooled_table_leaves_never_met_ids_out_of_the_mean_as_the_model_does():
    ranker = mean_pooled_growing_ranker()
    scorer = ExportedClickScorer(ranker)
    f = list(SPARSE_FEATURES).index("filters")
    g = torch.Generator().manual_seed(4)
    dense = torch.randn(3, len(DENSE_FEATURES), generator=g)
    ids = {name: torch.tensor([[1], [7], [6]]) for name in SPARSE_FEATURES}
    ids["filters"] = torch.tensor([[2, 7], [7, -1], [3, 11]])  # 7 and 11 never met: a half, all, a half of a bag
    with torch.no_grad():
        expected = ranker.model.sparse_arch(SparseFeatures.from_dense(ids))[:, f]  # (B, D)
        pooled = scorer.pooled(ids["filters"], "filters", True, 12)
        torch.testing.assert_close(pooled, expected)
        torch.testing.assert_close(pooled[0], ranker.model.sparse_arch.tables["filters"].embedding(torch.tensor(2)))
        torch.testing.assert_close(scorer(dense, *ids.values()), scorer.eager(dense, *ids.values()))
    # the export's own example and check batch put a met and a never-met id in one mean-pooled bag
    met = ranker.model.sparse_arch.tables["filters"].lookup
    for batch in (scorer.example(3, 2, seed=0), scorer.example(7, 4, seed=1)):
        bags = batch[1 + f]
        found = met(bags.clamp(min=0))[1] & (bags >= 0)
        assert bool((found.any(dim=1) & (~found & (bags >= 0)).any(dim=1)).any())


def test_the_export_check_refuses_a_scorer_that_counts_never_met_ids_in_a_mean(tmp_path, monkeypatch):
    ranker = mean_pooled_growing_ranker()
    assert export_dlrm(ranker, tmp_path / "right", "torchscript").exists()
    pooled = ExportedClickScorer.pooled

    def counting_never_met(self, ids, table, mean, size):  # never-met ids read as zero rows that count for the mean
        met, self.met = self.met, {}
        try:
            return pooled(self, ids, table, mean, size)
        finally:
            self.met = met

    monkeypatch.setattr(ExportedClickScorer, "pooled", counting_never_met)
    with pytest.raises(RuntimeError, match=r"the exported DLRM \(torchscript\) differs from eager PyTorch"):
        export_dlrm(ranker, tmp_path / "wrong", "torchscript")
    assert not (tmp_path / "wrong" / "model.pt").exists()


def contract_inputs(spec: dict, folder: Path, rows: pa.Table) -> list[np.ndarray]:
    """The inputs of an exported click scorer for click-out rows (`build_clickout_rows`), from ``model.json`` and
    ``vocab.parquet`` alone, as docs/deploy.md tells an outside user to build them."""
    import pyarrow.parquet as pq

    ids_of = spec["notes"]["ids_from_vocab"]
    vocab = pq.read_table(folder / ids_of["file"]).to_pylist()
    ids: dict[str, dict[str, int]] = {t["name"]: {} for t in spec["inputs"][1:]}
    for row in vocab:  # the i-th row of a feature, in file order, is id i + first
        of = ids.setdefault(row[ids_of["feature_column"]], {})
        of[row[ids_of["raw_column"]]] = len(of) + ids_of["first"]
    col = {name: np.array(rows.column(name).to_pylist(), dtype=object) for name in rows.column_names}
    n, price = rows.num_rows, col["price"].astype(float)
    span = np.maximum(col["num_impressions"].astype(float) - 1, 1)
    log_price = np.log1p(price)
    mean_log_price = {q: log_price[col["query"] == q].mean() for q in set(col["query"])}
    seconds, score = col["seconds_since"].astype(float), col["session_score"].astype(float)
    formulas = {  # docs/deploy.md, "Export": the dense features of a click-out row
        "log_price": log_price,
        "price_rank": col["price_rank"] / span,
        "relative_price": log_price - np.array([mean_log_price[q] for q in col["query"]]),
        "position_scaled": col["position"] / span,
        "log_num_impressions": np.log1p(col["num_impressions"].astype(float)),
        "log_prior_actions": np.log1p(col["prior_actions"].astype(float)),
        "interacted_before": (col["interactions"] > 0).astype(float),
        "log_interactions": np.log1p(col["interactions"].astype(float)),
        "last_interacted": col["last_interacted"].astype(float),
        "log_seconds_since": np.where(np.isnan(seconds), 0.0, np.log1p(np.maximum(np.nan_to_num(seconds), 0.0))),
        "session_score": np.nan_to_num(score),
        "has_session_score": (~np.isnan(score)).astype(float),
    }
    dense = np.stack([formulas[name] for name in spec["notes"]["dense_features"]], axis=1).astype(np.float32)
    sparse = []
    for t in spec["inputs"][1:]:
        values = [v if isinstance(v, list) else [v] for v in rows.column(t["name"]).to_pylist()]  # filters: a bag
        width = max(1, *(len(v) for v in values))
        matrix = np.full((n, width), ids_of["absent"], dtype=np.int64)
        for i, v in enumerate(values):
            matrix[i, :len(v)] = [ids[t["name"]].get(str(x), ids_of["unseen"]) for x in v]
        sparse.append(matrix)
    return [dense, *sparse]


def test_an_exported_click_scorer_gives_sessrec_tests_scores_from_its_contract(tmp_path):
    """Click-out rows scored through onnxruntime with inputs built from model.json and vocab.parquet alone (dense
    features by name and order, ids by the vocabulary's rows) get the scores `sessrec test` gives; an id past a
    feature's vocabulary is the unseen id, as `sessrec test` reads a hotel it never saw."""
    import pyarrow.parquet as pq
    from test_ranking_data import log_table

    from sessrec.tasks import ClickoutDataModule

    pq.write_table(log_table(), tmp_path / "log.parquet")
    data = ClickoutDataModule(str(tmp_path / "log.parquet"), test_hours=50 / 3600, valid_hours=30 / 3600, min_count=1)
    torch.manual_seed(0)
    task = DLRMTask(cardinalities=data.cardinalities, num_dense=data.num_dense, network=DLRMNetwork(
        embedding_dim=4, dense_layers=[8, 4], over_layers=[8])).eval()
    task.vocab = data.vocab
    with torch.no_grad():
        for p in task.model.parameters():  # every row its own, so that a wrong id shows
            p.add_(torch.randn(p.shape) * 0.5)
    path = export_dlrm(task.ranker(), tmp_path / "out", "onnx")
    spec = json.loads(path.with_suffix(".json").read_text())
    assert spec["notes"]["dense_features"] == list(DENSE_FEATURES)
    for split in ("train", "valid", "test"):  # the test split shows H4, which training never showed
        inputs = contract_inputs(spec, path.parent, data.rows[split])
        with torch.no_grad():
            expected = torch.cat([task(batch) for batch in RankingLoader(data.tensors(split), 100)]).numpy()
        (logits,) = run_exported(path, *map(torch.from_numpy, inputs))
        assert max_abs_diff(logits, expected) <= 1e-5, split
    inputs = [torch.from_numpy(a) for a in contract_inputs(spec, path.parent, data.rows["test"])]
    hotel = [t["name"] for t in spec["inputs"]].index("hotel")
    assert (inputs[hotel][1] == 1).all()  # H4: unseen
    far = [*inputs[:hotel], inputs[hotel].clone().fill_(10**9), *inputs[hotel + 1:]]
    unseen = [*inputs[:hotel], torch.ones_like(inputs[hotel]), *inputs[hotel + 1:]]
    np.testing.assert_array_equal(run_exported(path, *far)[0], run_exported(path, *unseen)[0])


def test_a_click_ranker_whose_parts_do_not_belong_together_is_not_exported(tmp_path):
    ranker = dlrm_task().ranker()
    ranker.vocab = ranking_vocab(9)  # 11 ids a feature, for tables of 7 rows
    with pytest.raises(ValueError, match=r"^feature 'hotel': its table has 7 rows and the ranker's vocabulary 11 ids"):
        export_dlrm(ranker, tmp_path, "onnx")
    assert not list(tmp_path.iterdir())


# -- Triton ---------------------------------------------------------------------------------------
TOKENS = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|(-?\d+)|([A-Za-z_][A-Za-z0-9_]*)|([{}\[\]:,]))')


def parse_pbtxt(text: str) -> dict:
    """Protobuf text format -> dict; a field given more than once, or as [a, b], becomes a list."""
    tokens = []
    for match in TOKENS.finditer(text.strip()):
        string, number, name, punct = match.groups()
        tokens.append(json.loads(string) if string else int(number) if number else ("name", name) if name else punct)
    pos = 0

    def value():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "{":
            return message("}")
        if tok == "[":
            items = []
            while tokens[pos] != "]":
                items.append(value())
                pos += tokens[pos] == ","
            pos += 1
            return items
        return tok[1] if isinstance(tok, tuple) else tok  # an enum name, a string or a number

    def message(end):
        nonlocal pos
        out: dict = {}
        while pos < len(tokens) and tokens[pos] != end:
            key = tokens[pos][1]
            pos += 1 + (tokens[pos + 1] == ":")
            v = value()
            out[key] = out[key] + (v if isinstance(v, list) else [v]) if key in out else v
        pos += 1
        return out

    return message(None)


@pytest.mark.slow
def test_triton_repository(tmp_path):
    task = session_task("sasrec_clm")
    model_dir = triton_repository(task.recommender(), tmp_path, "sasrec", max_batch_size=32, max_queue_delay_microseconds=500, top_k=20)
    assert model_dir == tmp_path / "sasrec"
    config = parse_pbtxt((model_dir / "config.pbtxt").read_text())
    assert config["name"] == "sasrec" and config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 32
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 500}
    assert config["input"] == [{"name": "items", "data_type": "TYPE_INT64", "dims": [-1]}]  # batch axis: Triton's
    assert config["output"] == [
        {"name": "scores", "data_type": "TYPE_FP32", "dims": [50]},
        {"name": "top_scores", "data_type": "TYPE_FP32", "dims": [20]},
        {"name": "top_items", "data_type": "TYPE_INT64", "dims": [20]},
    ]
    items = sessions(4, 8, seed=6)
    scores, _, top_items = run_exported(model_dir / "1" / "model.onnx", items)
    with torch.no_grad():
        expected = task.predict_step(SessionBatch(items=items), 0)
    np.testing.assert_array_equal(top_items, expected.items.numpy())
    assert scores.shape == (4, 50)


def test_triton_config_of_a_batch_only_output_and_without_batching():
    scorer = ExportedClickScorer(dlrm_task().ranker())
    spec = {"inputs": [asdict(t) for t in scorer.inputs()], "outputs": [asdict(t) for t in scorer.outputs()]}
    batched = parse_pbtxt(model_config("dlrm", spec, 64, 100))
    assert batched["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}]
    assert batched["input"][0] == {"name": "dense", "data_type": "TYPE_FP32", "dims": [12]}
    assert batched["input"][3] == {"name": "platform", "data_type": "TYPE_INT64", "dims": [-1]}
    unbatched = parse_pbtxt(model_config("dlrm", spec, 0, 100))
    assert "dynamic_batching" not in unbatched and unbatched["output"][0]["dims"] == [-1]
    assert unbatched["input"][0]["dims"] == [-1, 12]


def test_triton_repository_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="model name must be"):
        triton_repository(dlrm_task().ranker(), tmp_path, "a/b")
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=f"^max_batch_size must be an integer >= 0, got {bad!r}$"):
            triton_repository(dlrm_task().ranker(), tmp_path, "dlrm", max_batch_size=bad)
    with pytest.raises(ValueError, match="^max_queue_delay_microseconds must be an integer >= 0, got -5$"):
        triton_repository(dlrm_task().ranker(), tmp_path, "dlrm", max_queue_delay_microseconds=-5)
    assert not list(tmp_path.iterdir())


def exported_quietly(model_dir: Path, fmt: str, out: Path) -> subprocess.CompletedProcess:
    """`sessrec export` of `model_dir` run twice in a subprocess: without ``--show-warnings`` it prints nothing on
    stderr (checked here); with it, the run returned, whose stderr shows the third-party notices."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("SESSREC_SHOW_WARNINGS", None)

    def export(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sessrec.cli", "export", "--model_dir", str(model_dir), "--format",
                               fmt, "--out", str(out), *flags], capture_output=True, text=True, env=env, timeout=300)

    quiet, shown = export(), export("--show-warnings")
    assert quiet.returncode == shown.returncode == 0, quiet.stderr + shown.stderr
    assert quiet.stderr == "" and quiet.stdout.startswith("sessrec export: wrote ")
    return shown


@pytest.mark.slow
def test_sessrec_export_to_torchscript_shows_no_notice_of_transformers(tmp_path):
    """torch.jit.trace reads a Hugging Face encoder's ``loss_function`` and ``is_gradient_checkpointing``, on which
    transformers notes a loss sessrec never uses and a deprecation: hidden, as the README says, unless
    ``--show-warnings``."""
    model_dir = session_task("xlnet_mlm").recommender().save_pretrained(tmp_path / "model")
    shown = exported_quietly(model_dir, "torchscript", tmp_path / "out")
    assert "`loss_type=None` was set in the config but it is unrecognized" in shown.stderr
    assert "`is_gradient_checkpointing` is deprecated" in shown.stderr


@pytest.mark.slow
def test_sessrec_export_of_a_click_ranker_to_onnx_shows_no_notice_of_torch(tmp_path):
    """torch.onnx notes on a DLRM's export that its dense and id inputs share the batch axis's name: hidden, as the
    README says, unless ``--show-warnings``."""
    model_dir = dlrm_task().ranker().save_pretrained(tmp_path / "model")
    shown = exported_quietly(model_dir, "onnx", tmp_path / "out")
    assert "# The axis name: batch will not be used, since it shares the same shape constraints" in shown.stderr


@pytest.mark.parametrize("fmt", ["onnx", "triton"])
def test_a_saved_pipeline_is_refused_naming_what_it_is(tmp_path, sessrec_main, fmt):
    """A pipeline directory got 'not a saved model directory (no config.json)', as if nothing were saved there."""
    from sessrec.pipeline import Pipeline
    from sessrec.pipeline.retrieval.covisitation import CoVisitation

    vocab = ItemVocab(pa.array([7, 8, 9]), np.array([3, 2, 1]))
    sessions = np.array([[2, 3, 4], [0, 3, 4]])
    pipe = Pipeline(vocab, {"covisitation": (CoVisitation().fit(sessions, len(vocab)), 2)}, max_length=3)
    directory = pipe.save_pretrained(tmp_path / "pipeline")
    got = sessrec_main("export", "--model_dir", str(tmp_path / "pipeline"), "--out", str(tmp_path / "out"), "--format", fmt)
    assert got == (f"sessrec export: error: {tmp_path / 'pipeline'}: is a saved pipeline (pipeline.json), not a model "
                   "directory: Pipeline.from_pretrained and sessrec serve --model_dir read it; sessrec export and the model "
                   "readers take a session model's or a DLRM's model directory (a pipeline recipe's models.<name>.model_dir) "
                   "(--traceback for details)")
    assert (directory / "pipeline.json").is_file() and not (tmp_path / "out").exists()


# -- a session model that reads side features: servable from the export folder alone ------------------
EXPORT_SIDE = SideFeatures(categorical=["device", "shop"], continuous=["price", "score"], normalized=["score"],
                           time=["since_prev", "dwell"], position=4, min_count=2, nulls="pad")


def raw_sessions(n: int, seed: int, first: int = 0) -> pa.Table:
    """Sessions of 1..9 events (list layout) with raw side values: ``device`` text ('tablet' rare, a null now and
    then), ``shop`` integer codes, ``price`` >= 0 (NaN and nulls missing), ``score`` normalised upstream (negative too),
    ``timestamp`` in seconds."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n):
        k = int(rng.integers(1, 10))
        price = [None if u < 0.1 else float("nan") if u < 0.2 else float(p) for u, p in zip(rng.random(k), rng.gamma(2, 50, k))]
        rows.append({
            "session_id": first + s,
            "item_id": [int(i) for i in rng.integers(100, 130, k)],
            "device": [None if u < 0.05 else str(d) for u, d in zip(rng.random(k), rng.choice(["mobile", "desktop"], k))],
            "shop": [int(c) for c in rng.integers(1, 6, k)],
            "price": price,
            "score": [float(x) for x in rng.normal(0, 1, k)],
            "timestamp": [float(t) for t in 1.7e9 + 1000.0 * s + np.cumsum(rng.exponential(60, k))],
        })
    rows[0]["device"][0] = "tablet"  # seen once: rarer than min_count, the unseen id
    return pa.Table.from_pylist(rows)


def side_model_dir(directory: Path, encoder: torch.nn.Module, objective: object) -> Path:
    """A model directory of an untrained `encoder` (seed 0) reading `EXPORT_SIDE`'s side features, fitted on
    `raw_sessions(80, seed=0)`."""
    train = raw_sessions(80, seed=0)
    transform = SideFeatureTransform(EXPORT_SIDE).fit(train)
    vocab = ItemVocab.fit(pa.array([i for s in train.column("item_id").to_pylist() for i in s]))
    torch.manual_seed(0)
    task = NextItemTask(num_items=len(vocab), max_length=6, encoder=encoder, objective=objective,
                        side_features=transform.spec).eval()
    task.vocab, task.side_transform, task.side_config = vocab, transform, EXPORT_SIDE
    return task.recommender().save_pretrained(directory)


def session_contract_inputs(spec: dict, folder: Path, sessions: pa.Table) -> list[np.ndarray]:
    """The inputs of an exported session model for sessions of raw values (list layout: ``item_id``, one list per raw
    side column, ``timestamp``), from ``model.json``, ``vocab.parquet`` and the side-feature file alone (numpy and
    pyarrow), as docs/deploy.md tells an outside user to build them."""
    import pyarrow.parquet as pq

    item_ids = {raw: i + 2 for i, raw in enumerate(pq.read_table(folder / spec["vocab"]["file"]).column("raw_id").to_pylist())}
    side = spec.get("side_features") or {"inputs": {}}
    ids: dict[str, dict[str, int]] = {}
    if "file" in side:
        for row in pq.read_table(folder / side["file"]).to_pylist():
            ids.setdefault(row["feature"], {})[row["raw"]] = row["id"]
    rows = sessions.to_pylist()
    width = max(len(r["item_id"]) for r in rows)
    out = {t["name"]: np.zeros((len(rows), width), dtype=t["dtype"]) for t in spec["inputs"]}
    for b, row in enumerate(rows):
        order = np.argsort(row["timestamp"], kind="stable")  # a session's events in time order
        t = np.asarray(row["timestamp"], dtype=np.float64)[order]
        n, at = len(order), slice(width - len(order), width)  # right-aligned
        out["items"][b, at] = [item_ids.get(row["item_id"][i], 1) for i in order]
        if "event_times" in out:
            out["event_times"][b, at] = t
        for name, rule in side["inputs"].items():
            if rule["kind"] == "position":
                values = 1 + np.minimum(np.arange(n), rule["cap"] - 1)
            elif rule["kind"] == "categorical":
                raw = [row[rule["column"]][i] for i in order]
                values = [rule["missing"] if v is None else ids.get(name, {}).get(str(v), rule["unseen"]) for v in raw]
            else:
                if rule["kind"] == "time":
                    gaps = np.full(n, np.nan)
                    if rule["of"] == "since_prev":
                        gaps[1:] = np.diff(t)
                    else:
                        gaps[:-1] = np.diff(t)
                    x = gaps
                else:
                    x = np.array([np.nan if row[rule["column"]][i] is None else row[rule["column"]][i] for i in order],
                                 dtype=np.float64)
                finite = np.isfinite(x)
                if rule["transform"] == "log_normalize":
                    x = (np.log1p(np.where(finite, x, 0.0)) - rule["mean"]) / rule["std"]
                values = np.where(finite, x, rule["missing"])
            out[name][b, at] = values
    return [out[t["name"]] for t in spec["inputs"]]


@pytest.mark.parametrize("fmt", ["onnx", pytest.param("triton", marks=pytest.mark.slow)])
def test_an_exported_side_feature_model_gives_sessrec_predicts_top_k_from_its_contract(tmp_path, fmt):
    """A model that reads categorical (text and integer codes), position, continuous (log-normalised and normalised
    upstream) and time features: sessions of raw values, turned into the graph's inputs from the export folder alone
    (unseen and rare categories, nulls, NaN, sessions longer than max_length, events out of time order), get the
    top-k lists and scores of ``sessrec predict``."""
    import pyarrow.parquet as pq

    from sessrec.scoring import predict_file

    model_dir = side_model_dir(tmp_path / "model", XLNetEncoder(d_model=16, n_head=2, n_layer=1), MaskedItemModeling())
    scored = raw_sessions(12, seed=1, first=1000)
    rows = scored.to_pylist()
    rows[1].update(device=["watch", None, "mobile"], shop=[99, 2, 3], price=[float("inf"), None, 5.0],
                   item_id=[100, 999, 101], score=[1.0, float("nan"), -2.0], timestamp=[1.7e9 + 50, 1.7e9 + 10, 1.7e9 + 30])
    scored = pa.Table.from_pylist(rows, schema=scored.schema)  # unseen codes, missing values, events out of time order
    assert max(len(r["item_id"]) for r in rows) > 6  # longer than the model reads
    pq.write_table(scored, tmp_path / "sessions.parquet")
    predict_file(model_dir, tmp_path / "sessions.parquet", tmp_path / "recs.parquet", k=10)
    expected = pq.read_table(tmp_path / "recs.parquet").to_pylist()
    if fmt == "triton":
        folder = Path(cli_export(str(model_dir), str(tmp_path / "repo"), "triton", name="side", top_k=10)) / "1"
    else:
        folder = export_model_dir(model_dir, tmp_path / "out", "onnx", top_k=10).parent
    spec = json.loads((folder / "model.json").read_text())
    assert list(spec["side_features"]["inputs"]) == [t["name"] for t in spec["inputs"][1:]]
    inputs = session_contract_inputs(spec, folder, scored)
    import onnxruntime as ort

    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    _, top_scores, top_items = session.run(None, dict(zip([t["name"] for t in spec["inputs"]], inputs)))
    raw = pq.read_table(folder / "vocab.parquet").column("raw_id").to_pylist()
    for row, want in enumerate(expected):
        assert want["session_id"] == rows[row]["session_id"]
        assert [raw[i - 2] for i in top_items[row]] == want["item_ids"], row
        np.testing.assert_allclose(top_scores[row], want["scores"], atol=1e-5)
    blank = [inputs[0], *(np.zeros_like(a) for a in inputs[1:])]  # the side features are read: other inputs, other scores
    assert max_abs_diff(session.run(None, dict(zip([t["name"] for t in spec["inputs"]], blank)))[1], top_scores) > 1e-3


@pytest.mark.parametrize("value", [1e39, -1e39])
def test_sessrec_predict_refuses_a_side_value_beyond_float32_naming_file_column_value_and_event(tmp_path, value):
    """NaN, inf and nulls are missing values (0.0, as the export's rules say); a finite value past float32's range
    would reach the model as inf, which it refuses without naming the value: refused naming it, nothing written."""
    from sessrec.scoring import predict_file

    model_dir = side_model_dir(tmp_path / "model", SASRecEncoder(d_model=16, n_head=2, n_layer=1), CausalLanguageModeling())
    rows = raw_sessions(3, seed=1, first=1000).to_pylist()
    rows[1]["score"][-1] = value  # "score" is taken as given (normalised upstream)
    pq.write_table(pa.Table.from_pylist(rows, schema=raw_sessions(1, seed=1).schema), tmp_path / "sessions.parquet")
    message = (f"{tmp_path / 'sessions.parquet'}: column 'score' has the value {value!r} at event "
               f"{len(rows[1]['score']) - 1} of session 1001, beyond the float32 range (magnitude up to 3.4e+38) the "
               "model reads a feature in; scale the column")
    with pytest.raises(SchemaError, match="^" + re.escape(message) + "$"):
        predict_file(model_dir, tmp_path / "sessions.parquet", tmp_path / "out" / "recs.parquet", k=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "sessions.parquet"]


def test_a_model_that_reads_side_features_without_their_transforms_is_not_exported(tmp_path):
    """Its inputs are ids and normalised values that nothing in the folder would say how to build from raw ones."""
    task = session_task("sasrec_clm", side_features=SideInfoSpec(categorical={"device": 5}, continuous=["price"]))
    with pytest.raises(ValueError, match=r"^the model reads the side features \['device', 'price'\] but holds no fitted "
                                         r"transforms of their raw values \(a model directory's features.npz\)"):
        export_session_model(task.recommender(), tmp_path / "out", "onnx")
    assert not (tmp_path / "out").exists()


def test_an_export_without_side_features_removes_an_earlier_exports_categories(tmp_path):
    side = side_task("sasrec_clm", SideFeatures(categorical=["device"], position=3, nulls="pad", min_count=2))
    export_session_model(side.recommender(), tmp_path, "torchscript")
    spec = json.loads((tmp_path / "model.json").read_text())
    assert spec["side_features"]["inputs"]["position"] == {
        "kind": "position", "cap": 3, "rule": "1 + min(p, cap - 1), p the 0-based place of the event in its whole session"}
    assert pq.read_table(tmp_path / "side_features.parquet").to_pylist() == [
        {"feature": "device", "raw": "desktop", "id": 2}, {"feature": "device", "raw": "mobile", "id": 3}]
    export_session_model(session_task("sasrec_clm").recommender(), tmp_path, "torchscript")
    assert json.loads((tmp_path / "model.json").read_text())["side_features"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.pt", "vocab.parquet"]
