"""`SessionModelRetriever(runtime="onnxruntime")`: the query as an ONNX graph in onnxruntime, saved with the weights.

Its queries are eager PyTorch's within float rounding, its retrieved lists the model's own top-k; the graph is
saved with the weights and refused at load unless it gives their queries; a setting it cannot honour is refused.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from sessrec.data import ItemVocab
from sessrec.models import (
    CausalLanguageModeling,
    GRU4RecEncoder,
    HSTUEncoder,
    MaskedItemModeling,
    SASRecEncoder,
    SessionModel,
    XLNetEncoder,
)
from sessrec.pipeline import Pipeline, SessionModelRetriever
from sessrec.pipeline.candidates import RequestSessions
from sessrec.pipeline.retrieval.index import ExactIndex

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
torch.set_num_threads(1)

NUM_ITEMS, MAX_LENGTH = 60, 8


def model_of(encoder: torch.nn.Module, seed: int = 0, **kwargs) -> SessionModel:
    torch.manual_seed(seed)
    return SessionModel(num_items=NUM_ITEMS, encoder=encoder, max_length=MAX_LENGTH, **kwargs).eval()


def sessions(batch: int, width: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-aligned sessions (B, W) of 1 to W items (an OOV id among them) and their rising event times."""
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(2, NUM_ITEMS, (batch, width), generator=g)
    items[0, -1] = 1  # OOV
    sizes = torch.arange(batch) % width + 1
    items = items.masked_fill(torch.arange(width) < (width - sizes).unsqueeze(1), 0)
    times = 1.7e9 + torch.rand(batch, width, generator=g, dtype=torch.float64).mul(1e5).cumsum(1)
    return items, times.masked_fill(items == 0, 0.0)


@pytest.fixture(scope="module")
def hstu() -> SessionModel:
    model = model_of(HSTUEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0))
    with torch.no_grad():
        model.encoder.layers[0].time_bias.normal_()  # a trained one's: the times move the query
    return model


@pytest.fixture(scope="module")
def hstu_graph(hstu: SessionModel) -> SessionModelRetriever:
    """The HSTU's retriever in onnxruntime, its graph exported once for the module."""
    retriever = SessionModelRetriever(hstu, CausalLanguageModeling(), runtime="onnxruntime")
    retriever.query_graph()
    return retriever


CASES = {
    "xlnet-mlm": lambda: (model_of(XLNetEncoder(d_model=16, n_head=2, n_layer=1), score_scale=8.0), MaskedItemModeling()),
    "sasrec-clm": lambda: (model_of(SASRecEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0)), CausalLanguageModeling()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_graphs_queries_and_lists_are_eager_pytorchs(case: str) -> None:
    model, objective = CASES[case]()
    eager = SessionModelRetriever(model, objective, ExactIndex())
    graph = SessionModelRetriever(model, objective, ExactIndex(), runtime="onnxruntime")
    for batch, width in ((1, 1), (1, MAX_LENGTH), (7, 5), (4, MAX_LENGTH + 3)):  # none the export example's shape
        items, _ = sessions(batch, width)
        expected, got = eager.query_vectors(RequestSessions(items)), graph.query_vectors(RequestSessions(items))
        assert got.shape == (batch, 17) and got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
        assert torch.equal(got[:, -1], torch.ones(batch))
        ours, theirs = graph.retrieve(RequestSessions(items), 10), eager.retrieve(RequestSessions(items), 10)
        assert torch.equal(ours.items, theirs.items)
        with torch.no_grad():
            full = model(items, objective).masked_fill(~model.recommendable, float("-inf")).topk(10, dim=1)
        assert torch.equal(ours.items, full.indices)  # the model's own top-10


def test_an_hstu_graph_reads_the_sessions_times_and_refuses_sessions_without(hstu, hstu_graph) -> None:
    eager, graph = SessionModelRetriever(hstu, CausalLanguageModeling()), hstu_graph
    items, times = sessions(5, 6)
    got = graph.query_vectors(RequestSessions(items, times=times))
    torch.testing.assert_close(got, eager.query_vectors(RequestSessions(items, times=times)), rtol=0, atol=2e-5)
    later = times + torch.where(items > 0, torch.linspace(0, 3e6, 6, dtype=torch.float64), 0.0)
    assert not torch.allclose(graph.query_vectors(RequestSessions(items, times=later)), got, atol=1e-3)  # read, not traced in
    with pytest.raises(ValueError, match=r"runs in onnxruntime on the sessions' event times.*runtime='torch'"):
        graph.query_vectors(RequestSessions(items))
    eager.query_vectors(RequestSessions(items))  # eager PyTorch reads such sessions without the time term


def test_the_graph_is_saved_with_the_weights_and_loaded_without_exporting(hstu, hstu_graph, monkeypatch) -> None:
    graph = hstu_graph
    state = graph.state_dict()
    assert state["query_graph"].dtype == np.uint8 and state["query_graph"].size > 1000
    assert "query_graph" not in SessionModelRetriever(hstu, CausalLanguageModeling()).state_dict()
    monkeypatch.setattr(SessionModelRetriever, "_export", lambda self: pytest.fail("a load exported the graph again"))
    loaded = SessionModelRetriever(model_of(HSTUEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), seed=5),
                                   CausalLanguageModeling(), runtime="onnxruntime").load_state_dict(state)
    items, times = sessions(6, MAX_LENGTH)
    request = RequestSessions(items, times=times)
    assert torch.equal(loaded.query_vectors(request), graph.query_vectors(RequestSessions(items, times=times)))
    for copied in (copy.deepcopy(loaded), pickle.loads(pickle.dumps(loaded))):  # copies build their own session
        assert torch.equal(copied.query_vectors(RequestSessions(items, times=times)), loaded.query_vectors(request))


def test_a_graph_that_does_not_belong_to_the_weights_is_refused(hstu_graph: SessionModelRetriever) -> None:
    state = hstu_graph.state_dict()
    other = model_of(HSTUEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), seed=3)
    foreign = SessionModelRetriever(other, CausalLanguageModeling(), runtime="onnxruntime").state_dict()
    mixed = {**state, "query_graph": foreign["query_graph"]}  # the first model's weights, the second's graph
    fresh = lambda runtime="onnxruntime": SessionModelRetriever(
        model_of(HSTUEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0)), CausalLanguageModeling(), runtime=runtime)
    with pytest.raises(ValueError, match=r"saved query graph gives other queries than the retriever's weights \(by .* on "
                                         r"sessions of shape \(1, 1\)\): the graph and the weights do not belong together"):
        fresh().load_state_dict(mixed)
    with pytest.raises(ValueError, match="onnxruntime cannot read the graph"):
        fresh().load_state_dict({**state, "query_graph": np.frombuffer(b"not a graph", dtype=np.uint8)})
    with pytest.raises(ValueError, match=r"holds a query graph, but its config says runtime='torch'"):
        fresh("torch").load_state_dict(state)
    without = {k: v for k, v in state.items() if k != "query_graph"}
    with pytest.raises(ValueError, match=r"holds no query graph, but its config says runtime='onnxruntime'"):
        fresh().load_state_dict(without)


def test_settings_the_graph_cannot_honour_are_refused() -> None:
    with pytest.raises(ValueError, match="runtime must be 'torch' or 'onnxruntime', got 'tensorrt'"):
        SessionModelRetriever(model_of(SASRecEncoder(d_model=8, n_head=1, n_layer=1)), runtime="tensorrt")
    gru = model_of(GRU4RecEncoder(d_model=8))
    with pytest.raises(ValueError, match="GRU4Rec's query does not export to ONNX.*use runtime='torch'"):
        SessionModelRetriever(gru, CausalLanguageModeling(), runtime="onnxruntime")
    SessionModelRetriever(gru, CausalLanguageModeling())  # in PyTorch it retrieves
    graph = SessionModelRetriever(model_of(SASRecEncoder(d_model=8, n_head=1, n_layer=1)), runtime="onnxruntime")
    with pytest.raises(ValueError, match="runs in onnxruntime on the CPU.*cannot be on meta"):
        graph.to("meta")
    assert graph.device.type == "cpu"  # nothing moved


def test_a_saved_pipeline_keeps_its_graph_and_recommends_identically(tmp_path: Path) -> None:
    vocab = ItemVocab(pa.array(np.arange(1000, 1000 + NUM_ITEMS - 2)), np.arange(NUM_ITEMS - 2, 0, -1))
    model = model_of(XLNetEncoder(d_model=16, n_head=2, n_layer=1), score_scale=8.0)
    retriever = SessionModelRetriever(model, MaskedItemModeling(), runtime="onnxruntime")
    pipe = Pipeline(vocab, {"xlnet": (retriever, 10)}, max_length=MAX_LENGTH)
    requests = [[1000 + i for i in range(j % 7, j % 7 + 1 + j % 5)] for j in range(30)]
    before = pipe.recommend(requests, k=5)
    directory = pipe.save_pretrained(tmp_path / "pipeline")
    loaded = Pipeline.from_pretrained(directory)
    assert loaded.retrievers["xlnet"][0].runtime == "onnxruntime"
    assert loaded.recommend(requests, k=5) == before
    one_by_one = [loaded.recommend([r], k=5)[0] for r in requests]  # a request alone gets the list it gets in a batch
    assert [r["item_ids"] for r in one_by_one] == [r["item_ids"] for r in before]
    np.testing.assert_allclose([r["scores"] for r in one_by_one], [r["scores"] for r in before], rtol=0, atol=1e-5)
    eager = Pipeline(vocab, {"xlnet": (SessionModelRetriever(model, MaskedItemModeling()), 10)}, max_length=MAX_LENGTH)
    assert [r["item_ids"] for r in eager.recommend(requests, k=5)] == [r["item_ids"] for r in before]
