"""The artifacts own their model directories (`sessrec.artifacts`): `SessionRecommender` and `ClickRanker`.

Round trips that check values (every encoder kind with its objective, a session model with side
information, DLRM variants), the artifacts the tasks build (`NextItemTask.recommender`,
`DLRMTask.ranker`) and the tasks built back from them, and the one line a directory of another
format version, of the other kind or with bad sections is refused with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from sessrec.artifacts import ClickRanker, Inference, SessionRecommender, load_artifact
from sessrec.artifacts.model_directory import NETWORK, with_prefix, write_model_directory
from sessrec.data import ItemVocab, SideFeatures, SideInfoSpec
from sessrec.datasets.clickout_rows import CLICKS, SPARSE_FEATURES, RankingVocab
from sessrec.datasets.clickouts import DENSE_FEATURES
from sessrec.embeddings import DynamicTables, FusedTables, HybridTables, SparseFeatures, TableConfig
from sessrec.features import SideFeatureTransform
from sessrec.models import (
    DLRM,
    BertEncoder,
    CausalLanguageModeling,
    ElectraEncoder,
    GPT2Encoder,
    GRU4RecEncoder,
    MaskedItemModeling,
    PermutationLanguageModeling,
    ReplacedTokenDetection,
    SASRecEncoder,
    SessionModel,
    SideInfoConfig,
    SideInfoEmbedding,
    XLNetEncoder,
)
from sessrec.saved.directory import write_description
from sessrec.saved.registry import ConfigError, config_of
from sessrec.tasks import DLRMTask, Evaluation, NextItemTask

torch.set_num_threads(1)
NUM_ITEMS = 40
ENCODERS = {  # each encoder kind with an objective it trains with
    "xlnet_plm": (lambda: XLNetEncoder(d_model=8, n_head=2, n_layer=1), PermutationLanguageModeling),
    "bert_mlm": (lambda: BertEncoder(d_model=8, n_head=2, n_layer=1), MaskedItemModeling),
    "electra_rtd": (lambda: ElectraEncoder(d_model=8, n_head=2, n_layer=1), ReplacedTokenDetection),
    "gpt2_clm": (lambda: GPT2Encoder(d_model=8, n_head=2, n_layer=1), CausalLanguageModeling),
    "sasrec_clm": (lambda: SASRecEncoder(d_model=8, n_head=2, n_layer=1), CausalLanguageModeling),
    "gru4rec_clm": (lambda: GRU4RecEncoder(d_model=8), CausalLanguageModeling),
}
SESSIONS = torch.tensor([[0, 0, 3, 4, 5], [2, 9, 3, 7, 11], [0, 0, 0, 0, 30]])


@pytest.fixture(scope="module")
def vocab() -> ItemVocab:
    return ItemVocab(pa.array(np.arange(100, 100 + NUM_ITEMS - 2)), np.arange(NUM_ITEMS - 2, 0, -1))


def ranking_vocab() -> RankingVocab:
    return RankingVocab({name: ItemVocab(pa.array([f"{name}{i}" for i in range(5)]), np.ones(5, dtype=np.int64))
                         for name in (*SPARSE_FEATURES, CLICKS)})


def trained(module: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """`module` with every parameter moved off its initialisation (a saved copy that loads fresh weights differs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return module


def session_model(name: str, max_length: int = 5) -> tuple[SessionModel, object]:
    torch.manual_seed(0)
    encoder, objective = ENCODERS[name]
    model = SessionModel(NUM_ITEMS, encoder(), max_length=max_length)
    objective = objective()
    objective.bind(model)
    return trained(model).eval(), objective


def read_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("name", ENCODERS)
def test_a_session_recommender_round_trips_with_identical_scores(tmp_path, vocab, name):
    model, objective = session_model(name)
    if isinstance(objective, torch.nn.Module):
        trained(objective, seed=2)
    saved = SessionRecommender(model, objective, vocab, Inference(max_length=5, exclude_seen=True, top_k=7))
    path = saved.save_pretrained(tmp_path / "model")
    loaded = SessionRecommender.from_pretrained(path)
    assert type(loaded.model.encoder) is type(model.encoder) and type(loaded.objective) is type(objective)
    assert loaded.vocab == vocab
    assert loaded.inference == Inference(max_length=5, exclude_seen=True, top_k=7)
    assert not loaded.model.training
    with torch.no_grad():
        expected = saved.scores(SESSIONS)
        assert torch.equal(loaded.scores(SESSIONS), expected)  # the saved objective reads the next item
        assert torch.isinf(expected.gather(1, SESSIONS)[SESSIONS > 0]).all()  # exclude_seen, as saved
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
    if isinstance(objective, torch.nn.Module):  # RTD's generator: in the weights, not part of the network
        for key, value in objective.state_dict().items():
            assert torch.equal(loaded.objective.state_dict()[key], value), key
        assert not any(k.startswith("objective.") for k in loaded.model.state_dict())
    config = read_config(path)
    assert config["version"] == 5 and "task" not in config
    assert set(config) == {"format", "version", "model", "objective", "inference", "vocab", "parts", "hash"}
    assert config["objective"]["class_path"] == f"{type(objective).__module__}.{type(objective).__qualname__}"
    assert type(load_artifact(path)) is SessionRecommender


@pytest.mark.parametrize("name", ["sasrec_clm", "bert_mlm"])
def test_scores_of_ids_that_are_no_model_ids_are_refused_naming_the_value_and_its_place(vocab, name):
    """A negative id, an id past the vocabulary or a float tensor is a one-line ValueError naming the value,
    its (row, column) and the model's id range, from the recommender and from the network called alone."""
    model, objective = session_model(name)
    recommender = SessionRecommender(model, objective, vocab, Inference(max_length=5))
    cases = [
        (SESSIONS.masked_fill(SESSIONS == 7, NUM_ITEMS), f"items: model id {NUM_ITEMS} at [1, 3] is out of range: "
         f"the model's ids are 0..{NUM_ITEMS - 1} (0 padding, 1 out-of-vocabulary)"),
        (SESSIONS.masked_fill(SESSIONS == 30, -3), f"items: model id -3 at [2, 4] is out of range: "
         f"the model's ids are 0..{NUM_ITEMS - 1} (0 padding, 1 out-of-vocabulary)"),
        (SESSIONS.float().index_put((torch.tensor(0), torch.tensor(3)), torch.tensor(4.5)),
         f"items: model ids are integers (int64) 0..{NUM_ITEMS - 1}, got a float32 tensor: 4.5 at [0, 3]"),
    ]
    with torch.no_grad():
        for items, message in cases:
            for call in (recommender.scores, lambda x: model(x, objective), model):
                with pytest.raises(ValueError) as err:
                    call(items)
                assert str(err.value) == message
        assert recommender.scores(SESSIONS).shape == (3, NUM_ITEMS)


def test_saving_a_loaded_recommender_writes_the_same_directory(tmp_path, vocab):
    model, objective = session_model("xlnet_plm")
    first = SessionRecommender(model, objective, vocab, Inference(4, True, 3)).save_pretrained(tmp_path / "a")
    again = SessionRecommender.from_pretrained(first).save_pretrained(tmp_path / "b")
    a, b = read_config(first), read_config(again)
    assert {k: b[k] for k in ("model", "objective", "inference", "vocab")} == {
        k: a[k] for k in ("model", "objective", "inference", "vocab")}
    assert b["inference"] == {"max_length": 4, "exclude_seen": True, "top_k": 3}
    assert a["parts"] == b["parts"]  # the same weights and vocabulary, byte for byte


def test_a_session_recommender_carries_the_data_configuration_it_is_given(tmp_path, vocab):
    model, objective = session_model("gru4rec_clm")
    data = {"class_path": "sessrec.tasks.session_data.SessionDataModule", "init_args": {
        "source": {"class_path": "sessrec.data.sources.SRGNNSource", "init_args": {"path": "d", "valid_fraction": 0.02}},
        "max_length": 5, "batch_size": 64}}
    path = SessionRecommender(model, objective, vocab, Inference(5), data=data).save_pretrained(tmp_path / "with")
    assert read_config(path)["data"] == data and SessionRecommender.from_pretrained(path).data == data
    again = SessionRecommender.from_pretrained(path).save_pretrained(tmp_path / "again")
    assert read_config(again)["data"] == data
    bare = SessionRecommender(model, objective, vocab, Inference(5)).save_pretrained(tmp_path / "bare")
    assert "data" not in read_config(bare) and SessionRecommender.from_pretrained(bare).data is None
    with pytest.raises(TypeError, match="data configuration is a mapping or None, got list"):
        SessionRecommender(model, objective, vocab, Inference(5), data=[data])


def test_a_session_recommender_with_side_information_round_trips_with_its_transforms(tmp_path, vocab):
    torch.manual_seed(0)
    spec = SideInfoSpec(categorical={"device": 4}, continuous=["price"], item_vectors={"text": 3})
    side = SideInfoEmbedding(8, NUM_ITEMS, spec, SideInfoConfig(aggregation="sum", soft_one_hot_bins=4))
    model = trained(SessionModel(NUM_ITEMS, BertEncoder(d_model=8, n_head=2, n_layer=1), max_length=5, side_info=side))
    side.item_vectors.set_vectors("text", torch.randn(NUM_ITEMS, 3))
    table = pa.table({"item_id": [[100, 101], [102]], "device": [["mobile", "tv"], ["mobile"]], "price": [[1.5, 2.0], [None]]})
    settings = SideFeatures(categorical=["device"], continuous=["price"])
    transform = SideFeatureTransform(settings).fit(table)
    saved = SessionRecommender(model.eval(), MaskedItemModeling(), vocab, Inference(5), transform, settings)
    loaded = SessionRecommender.from_pretrained(saved.save_pretrained(tmp_path / "model"))
    features = {"device": torch.tensor([[0, 1, 2, 3, 3]] * 3), "price": torch.linspace(0, 1, 15).view(3, 5)}
    with torch.no_grad():
        assert torch.equal(loaded.scores(SESSIONS, features), saved.scores(SESSIONS, features))
    assert loaded.side_features == settings
    for name, values in transform.transform(table).items():
        np.testing.assert_array_equal(loaded.side_transform.transform(table)[name], values)
    assert isinstance(loaded.objective, MaskedItemModeling)


def test_a_session_recommender_refuses_side_transforms_its_network_was_not_built_for(vocab):
    """Transforms fitted on other data (a category more) or of other features gave ids the tables do not hold."""
    side = SideInfoEmbedding(8, NUM_ITEMS, SideInfoSpec(categorical={"device": 4}, continuous=["price"]))
    model = SessionModel(NUM_ITEMS, BertEncoder(d_model=8, n_head=2, n_layer=1), max_length=5, side_info=side).eval()
    table = pa.table({"item_id": [[100, 101, 102]], "device": [["mobile", "tv", "car"]], "price": [[1.5, 2.0, 3.0]]})
    settings = SideFeatures(categorical=["device"], continuous=["price"])
    wider = SideFeatureTransform(settings).fit(table)
    with pytest.raises(ValueError, match=re.escape("the side-feature transforms do not match the model's: 'device' has "
                                                   "5 ids there and 4 in the network")):
        SessionRecommender(model, MaskedItemModeling(), vocab, Inference(5), wider, settings)
    fewer = SideFeatureTransform(SideFeatures(categorical=["device"])).fit(table.slice(0, 1).select(["item_id", "device"]))
    with pytest.raises(ValueError, match=re.escape("categorical ['device'] and continuous [] there, ['device'] and "
                                                   "['price'] in the network")):
        SessionRecommender(model, MaskedItemModeling(), vocab, Inference(5), fewer)


def dlrm(**kwargs) -> DLRM:
    """A DLRM of a click-out row's features, 7 ids each as `ranking_vocab` gives them, hotel and position in one table."""
    torch.manual_seed(0)
    tables = [TableConfig("shared", 7, 4, feature_names=("hotel", "position")),
              *(TableConfig(name, 7, 4) for name in ("platform", "city", "device", "last_action")),
              TableConfig("filters", 7, 4, pooling="mean")]
    return DLRM(len(DENSE_FEATURES), tables, dense_layers=[8, 4], over_layers=[8], seed=3, **kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"interaction": "dcn", "dcn_layers": 1, "dcn_rank": 2},
                                    {"sparse": FusedTables(optimizer="adagrad_rowwise")}, {"sparse": HybridTables(num_hot=2)}],
                         ids=["dot", "dcn", "adagrad", "hybrid"])
def test_a_click_ranker_round_trips_with_identical_scores(tmp_path, kwargs):
    model = trained(dlrm(**kwargs)).eval()
    ids = {"hotel": torch.tensor([[1], [2], [5]]), "position": torch.tensor([[0], [3], [4]]),
           **{name: torch.tensor([[1], [6], [0]]) for name in ("platform", "city", "device", "last_action")},
           "filters": torch.tensor([[1, 2], [4, -1], [-1, -1]])}
    dense = torch.randn(3, len(DENSE_FEATURES))
    vocab = ranking_vocab()
    path = ClickRanker(model, vocab).save_pretrained(tmp_path / "dlrm")
    loaded = ClickRanker.from_pretrained(path)
    assert loaded.vocab.cardinalities == vocab.cardinalities and loaded.vocab.fingerprint() == vocab.fingerprint()
    with torch.no_grad():
        assert torch.equal(loaded.model(dense, SparseFeatures.from_dense(ids)), model(dense, SparseFeatures.from_dense(ids)))
    assert type(load_artifact(path)) is ClickRanker
    assert set(read_config(path)) == {"format", "version", "model", "vocab", "parts", "hash"}


def test_a_click_ranker_of_parts_that_do_not_belong_together_is_refused_built_saved_and_loaded(tmp_path):
    other = DLRM(3, [TableConfig("city", 7, 4), TableConfig("tags", 7, 4)], dense_layers=[8, 4], over_layers=[8])
    with pytest.raises(ValueError, match=r"^this click ranker's DLRM reads the sparse features \['city', 'tags'\] and 3 dense "
                                         r"features; its vocabulary and a click-out row give \['hotel', .*'filters'\] and 12 "
                                         r"\(log_price, .*has_session_score\): they do not belong together$"):
        ClickRanker(other, ranking_vocab())
    larger = RankingVocab({name: ItemVocab(pa.array([f"{name}{i}" for i in range(9)]), np.ones(9, dtype=np.int64))
                           for name in (*SPARSE_FEATURES, CLICKS)})
    mismatch = r"feature 'hotel': its table has 7 rows and the ranker's vocabulary 11 ids: they do not belong together$"
    with pytest.raises(ValueError, match="^" + mismatch):
        ClickRanker(dlrm(), larger)
    ranker = ClickRanker(dlrm(), ranking_vocab())
    ranker.vocab = larger
    with pytest.raises(ValueError, match="^" + mismatch):
        ranker.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()
    model = dlrm()
    folder = write_model_directory(tmp_path / "written", {"model": config_of(model)}, with_prefix(model.state_dict(), NETWORK),
                                   larger)
    with pytest.raises(ValueError, match=f"^{re.escape(str(folder))}: {mismatch}"):
        ClickRanker.from_pretrained(folder)
    ClickRanker(DLRM(len(DENSE_FEATURES), [TableConfig(n, 3, 4) for n in SPARSE_FEATURES], dense_layers=[8, 4], over_layers=[8],
                     sparse=DynamicTables()), larger)  # growing tables take any id, whatever their initial rows


# --------------------------------------------------------------------------- the tasks' artifacts
def next_item_task(vocab: ItemVocab, **kwargs) -> NextItemTask:
    torch.manual_seed(0)
    task = NextItemTask(num_items=NUM_ITEMS, max_length=5, encoder=ElectraEncoder(d_model=8, n_head=2, n_layer=1),
                        objective=ReplacedTokenDetection(), evaluation=Evaluation(top_k=9, exclude_seen=True), **kwargs)
    trained(task)
    task.vocab = vocab
    return task.eval()


def test_a_task_writes_its_recommender_and_trains_on_from_it(tmp_path, vocab):
    task = next_item_task(vocab)
    path = task.recommender().save_pretrained(tmp_path / "model")
    config = read_config(path)
    assert config["model"] == config_of(task.model) and config["inference"] == {"max_length": 5, "exclude_seen": True, "top_k": 9}
    loaded = SessionRecommender.from_pretrained(path)
    with torch.no_grad():
        assert torch.equal(loaded.scores(SESSIONS), task.recommender().scores(SESSIONS))
    assert loaded.vocab == vocab and isinstance(loaded.objective, ReplacedTokenDetection)
    again = NextItemTask.from_recommender(loaded)
    assert again.evaluation.exclude_seen and again.evaluation.top_k == 9 and again.hparams.max_length == 5
    for key, value in task.state_dict().items():  # the generator too
        assert torch.equal(again.state_dict()[key], value), key
    assert again.vocab == vocab


@pytest.mark.parametrize("k", [0, -1, 2.0, True, "3"])
def test_a_task_recommends_k_items_and_refuses_a_k_that_is_no_count_in_one_line(vocab, k):
    task = next_item_task(vocab)
    with torch.no_grad():
        top = task.recommend(SESSIONS, np.int64(4))  # an integer of any kind
        assert top.items.shape == top.scores.shape == (len(SESSIONS), 4)
        with pytest.raises(ValueError, match=rf"^k must be an integer >= 1, got {re.escape(repr(k))}$"):
            task.recommend(SESSIONS, k)


def test_a_recommender_of_another_window_is_refused_by_the_task_with_one_line(vocab):
    model, objective = session_model("sasrec_clm")  # the network reads 5 items
    with pytest.raises(ValueError, match=r"^the network reads 5 items and serving 3, where a NextItemTask"):
        NextItemTask.from_recommender(SessionRecommender(model, objective, vocab, Inference(3)))


def test_a_dlrm_task_writes_its_ranker_and_is_built_back_from_it(tmp_path):
    torch.manual_seed(0)
    vocab = ranking_vocab()
    task = trained(DLRMTask(cardinalities=vocab.cardinalities, num_dense=len(DENSE_FEATURES),
                            network={"embedding_dim": 4, "dense_layers": [8, 4], "over_layers": [8]})).eval()
    task.vocab = vocab
    ranker = ClickRanker.from_pretrained(task.ranker().save_pretrained(tmp_path / "task"))
    for key, value in task.model.state_dict().items():
        assert torch.equal(ranker.model.state_dict()[key], value), key
    back = DLRMTask.from_ranker(ranker)
    assert back.hparams.cardinalities == vocab.cardinalities and back.sparse == FusedTables(optimizer="adagrad_rowwise", lr=0.05)
    for key, value in task.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_a_dlrm_with_shared_tables_is_refused_by_the_task_with_one_line(tmp_path):
    ranker = ClickRanker.from_pretrained(ClickRanker(dlrm(), ranking_vocab()).save_pretrained(tmp_path / "dlrm"))
    with pytest.raises(ValueError, match=r"^a DLRMTask builds one summed table per feature, all of one width"):
        DLRMTask.from_ranker(ranker)


# --------------------------------------------------------------------------- refused, in one line
@pytest.mark.parametrize("version", [1, 2, 3, 4, 6])
def test_a_directory_of_another_format_version_is_refused_with_one_line(tmp_path, vocab, version):
    model, objective = session_model("gru4rec_clm")
    path = SessionRecommender(model, objective, vocab, Inference(5)).save_pretrained(tmp_path / "model")
    config = read_config(path)
    config["version"] = version
    (path / "config.json").write_text(json.dumps(config))
    for loader in (SessionRecommender.from_pretrained, ClickRanker.from_pretrained, load_artifact):
        with pytest.raises(ValueError) as info:
            loader(path)
        assert str(info.value) == (
            f"{path / 'config.json'}: a model directory of format version {version}, which this sessrec does not read "
            "(it reads version 5): retrain the model with sessrec fit, which writes a version 5 directory")


def test_a_directory_of_the_other_kind_is_refused_with_one_line(tmp_path, vocab):
    model, objective = session_model("gru4rec_clm")
    session_dir = SessionRecommender(model, objective, vocab, Inference(5)).save_pretrained(tmp_path / "session")
    dlrm_dir = ClickRanker(dlrm(), ranking_vocab()).save_pretrained(tmp_path / "dlrm")
    with pytest.raises(ConfigError, match=r"dlrm/config.json: model: this directory holds a click ranker: load it with "
                                          r"ClickRanker.from_pretrained$"):
        SessionRecommender.from_pretrained(dlrm_dir)
    with pytest.raises(ConfigError, match=r"session/config.json: model: this directory holds a session model: load it "
                                          r"with SessionRecommender.from_pretrained$"):
        ClickRanker.from_pretrained(session_dir)


@pytest.mark.parametrize("section, value, message", [
    ("inference", {"max_length": 0, "exclude_seen": False, "top_k": 20}, "inference: inference max_length must be an integer >= 1, got 0"),
    ("inference", {"max_length": 5, "top_k": 20, "exclude": True}, "inference: unknown settings ['exclude']"),
    ("objective", {"class_path": "sessrec.models.MaskedItemModeling"}, "objective: MaskedItemModeling predicts hidden items"),
    ("model", {"class_path": "sessrec.tasks.NextItemTask"}, "model: 'sessrec.tasks.NextItemTask' is a registered class, but not a"),
])
def test_bad_sections_are_refused_with_one_line(tmp_path, vocab, section, value, message):
    model, objective = session_model("gru4rec_clm")
    path = SessionRecommender(model, objective, vocab, Inference(5)).save_pretrained(tmp_path / "model")
    config = read_config(path)
    config[section] = value
    write_description(path, "config.json", config)  # its content hash recomputed: the section's own check is under test
    with pytest.raises(ConfigError) as info:
        SessionRecommender.from_pretrained(path)
    assert str(info.value).startswith(f"{path / 'config.json'}: {message}") and "\n" not in str(info.value), str(info.value)


def test_a_recommender_is_refused_a_vocabulary_of_another_size(tmp_path):
    model, objective = session_model("gru4rec_clm")
    small = ItemVocab(pa.array(np.arange(5)), np.ones(5, dtype=np.int64))
    with pytest.raises(ValueError, match=r"^the vocabulary has 7 ids where the model scores 40"):
        SessionRecommender(model, objective, small, Inference(5))
    assert not (tmp_path / "model").exists()


def test_a_recommender_is_refused_a_vocabulary_whose_virtual_items_its_network_would_recommend(tmp_path):
    """A network built without the vocabulary's num_virtual scored its page-view tokens as items: saved, loaded and
    served, they were recommended."""
    model, objective = session_model("gru4rec_clm")  # num_virtual 0
    pages = ItemVocab(pa.array(np.arange(100, 100 + NUM_ITEMS - 2)), np.ones(NUM_ITEMS - 2, dtype=np.int64), num_virtual=3)
    with pytest.raises(ValueError, match=r"^the vocabulary's last 3 ids are virtual \(input-only\) items where the model "
                                         r"has 0: build SessionModel with num_virtual=3 \(else they would be recommended\)$"):
        SessionRecommender(model, objective, pages, Inference(5))


def test_a_recommender_serving_more_items_than_its_network_reads_is_refused(vocab):
    model, objective = session_model("gru4rec_clm")  # reads 5 items
    with pytest.raises(ValueError, match=r"^inference max_length 6 is more than the 5 items the network reads"):
        SessionRecommender(model, objective, vocab, Inference(6))


@pytest.mark.parametrize("name", ["sasrec_clm", "bert_mlm"])
def test_a_recommender_scores_the_latest_items_its_inference_settings_read(vocab, name):
    """A recommender serving fewer items than its network reads scores a session by its latest
    `inference.max_length` items, as ``sessrec predict`` and the server (which cut the sessions there) do."""
    model, objective = session_model(name)  # the network reads 5 items
    recommender = SessionRecommender(model, objective, vocab, Inference(max_length=3))
    with torch.no_grad():
        assert torch.equal(recommender.scores(SESSIONS), recommender.scores(SESSIONS[:, -3:]))
        assert not torch.equal(model(SESSIONS, objective), model(SESSIONS[:, -3:], objective))


def test_sessrec_retrain_picks_its_turn_by_the_directorys_sections(tmp_path, vocab):
    from sessrec.artifacts import artifact_class

    model, objective = session_model("gru4rec_clm")
    session_dir = SessionRecommender(model, objective, vocab, Inference(5)).save_pretrained(tmp_path / "session")
    dlrm_dir = ClickRanker(dlrm(), ranking_vocab()).save_pretrained(tmp_path / "dlrm")
    assert artifact_class(str(session_dir)) is SessionRecommender
    assert artifact_class(dlrm_dir) is ClickRanker
    with pytest.raises(FileNotFoundError, match=r"nowhere: no such model directory$"):
        artifact_class(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_refused_at_save_and_at_load_naming_the_tensor(tmp_path, vocab, value,
                                                                                     monkeypatch):
    """A NaN or infinite weight would rank items by NaN with exit 0: refused in one line when the directory is
    written (nothing left behind) and when one written without the check is read (`sessrec predict`, `sessrec serve`,
    `sessrec export`)."""
    import sessrec.artifacts.model_directory as model_directory
    from sessrec.serving.recommender import load_recommender

    model, objective = session_model("sasrec_clm")
    with torch.no_grad():
        model.item_embedding.weight[7, 3] = value
    recommender = SessionRecommender(model, objective, vocab, Inference(max_length=5))
    message = (f"tensor 'model.item_embedding.weight' holds {value} at [7, 3] (1 of {model.item_embedding.weight.numel()} "
               "values are not finite numbers): a model with NaN or infinite weights ranks items by them; retrain it, "
               "or save it from a checkpoint of before it diverged")
    target = tmp_path / "nested" / "model"
    with pytest.raises(ValueError, match="^" + re.escape(f"{target}: not saved: {message}") + "$"):
        recommender.save_pretrained(target)
    assert list(tmp_path.iterdir()) == []
    with monkeypatch.context() as patch:
        patch.setattr(model_directory, "check_finite", lambda weights, source: None)  # a directory saved unchecked
        path = recommender.save_pretrained(tmp_path / "model")
    for load in (SessionRecommender.from_pretrained, load_recommender):
        with pytest.raises(ValueError, match="^" + re.escape(f"{path / 'model.safetensors'}: {message}") + "$"):
            load(path)
