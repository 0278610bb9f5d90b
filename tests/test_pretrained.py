"""Networks save and load themselves (`sessrec.models.pretrained`), and tasks share their directories.

Research code round trip (every encoder kind with its objective, a session model with side
information, DLRM variants), a task's directory read by the network loader and a network's by the
task loader, directories of format versions 1 and 2 (a task section only) through both loaders,
the task config -> network config translation against the networks the tasks build, and the one
line a directory of the wrong kind or with bad settings is refused with.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from sessrec.data import ItemVocab, SideFeatures, SideInfoSpec
from sessrec.datasets.clickout_rows import CLICKS, SPARSE_FEATURES, RankingVocab
from sessrec.embeddings import FusedTables, HybridTables, SparseFeatures, TableConfig
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
from sessrec.models.pretrained import Inference, load_pretrained, sections_from_task
from sessrec.saved.registry import ConfigError, config_of
from sessrec.tasks import DLRMTask, Evaluation, NextItemTask
from sessrec.tasks.pretrained import Pretrained, plain_hparams
from sessrec.tasks.settings import DLRMNetwork

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


def session_model(name: str, max_length: int = 6) -> tuple[SessionModel, object]:
    torch.manual_seed(0)
    encoder, objective = ENCODERS[name]
    model = SessionModel(NUM_ITEMS, encoder(), max_length=max_length)
    objective = objective()
    objective.bind(model)
    return trained(model).eval(), objective


def read_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


# --------------------------------------------------------------------------- research code round trip
@pytest.mark.parametrize("name", ENCODERS)
def test_a_session_model_round_trips_with_its_objective_and_vocabulary(tmp_path, vocab, name):
    model, objective = session_model(name)
    if isinstance(objective, torch.nn.Module):
        trained(objective, seed=2)
    path = model.save_pretrained(tmp_path / "model", vocab, objective, exclude_seen=True, top_k=7)
    loaded = SessionModel.from_pretrained(path)
    assert type(loaded.encoder) is type(model.encoder) and type(loaded.objective) is type(objective)
    assert loaded.vocab == vocab
    assert loaded.inference == Inference(max_length=5, exclude_seen=True, top_k=7)
    assert not loaded.training
    with torch.no_grad():
        assert torch.equal(loaded(SESSIONS), model(SESSIONS, objective))  # the saved objective reads the next item
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    if isinstance(objective, torch.nn.Module):  # RTD's generator: in the weights, not part of the network
        for key, value in objective.state_dict().items():
            assert torch.equal(loaded.objective.state_dict()[key], value), key
        assert not any(k.startswith("objective.") for k in loaded.state_dict())
    config = read_config(path)
    assert config["version"] == 3 and "task" not in config
    assert config["objective"]["class_path"] == f"{type(objective).__module__}.{type(objective).__qualname__}"


def test_saving_a_loaded_model_keeps_what_it_was_loaded_with(tmp_path, vocab):
    model, objective = session_model("xlnet_plm")
    first = model.save_pretrained(tmp_path / "a", vocab, objective, max_length=4, exclude_seen=True, top_k=3)
    again = SessionModel.from_pretrained(first).save_pretrained(tmp_path / "b")
    a, b = read_config(first), read_config(again)
    assert {k: b[k] for k in ("model", "objective", "inference", "vocab")} == {
        k: a[k] for k in ("model", "objective", "inference", "vocab")}
    assert b["inference"] == {"max_length": 4, "exclude_seen": True, "top_k": 3}
    assert a["parts"] == b["parts"]  # the same weights and vocabulary, byte for byte


def test_a_session_model_with_side_information_round_trips_with_its_transforms(tmp_path, vocab):
    torch.manual_seed(0)
    spec = SideInfoSpec(categorical={"device": 5}, continuous=["price"], item_vectors={"text": 3})
    side = SideInfoEmbedding(8, NUM_ITEMS, spec, SideInfoConfig(aggregation="sum", soft_one_hot_bins=4))
    model = trained(SessionModel(NUM_ITEMS, BertEncoder(d_model=8, n_head=2, n_layer=1), max_length=6, side_info=side))
    side.item_vectors.set_vectors("text", torch.randn(NUM_ITEMS, 3))
    table = pa.table({"item_id": [[100, 101], [102]], "device": [["mobile", "tv"], ["mobile"]], "price": [[1.5, 2.0], [None]]})
    settings = SideFeatures(categorical=["device"], continuous=["price"])
    transform = SideFeatureTransform(settings).fit(table)
    path = model.eval().save_pretrained(tmp_path / "model", vocab, side_transform=transform, side_features=settings)
    loaded = SessionModel.from_pretrained(path)
    features = {"device": torch.tensor([[0, 1, 2, 3, 4]] * 3), "price": torch.linspace(0, 1, 15).view(3, 5)}
    with torch.no_grad():
        assert torch.equal(loaded(SESSIONS, features=features), model(SESSIONS, features=features))
    assert loaded.side_features == settings
    for name, values in transform.transform(table).items():
        np.testing.assert_array_equal(loaded.side_transform.transform(table)[name], values)
    assert isinstance(loaded.objective, MaskedItemModeling)  # the model's default, recorded


def dlrm(**kwargs) -> DLRM:
    torch.manual_seed(0)
    tables = [TableConfig("shared", 6, 4, feature_names=("item", "last_item")), TableConfig("tags", 5, 4, pooling="mean")]
    return DLRM(3, tables, dense_layers=[8, 4], over_layers=[8], seed=3, **kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"interaction": "dcn", "dcn_layers": 1, "dcn_rank": 2},
                                    {"sparse": FusedTables(optimizer="adagrad_rowwise")}, {"sparse": HybridTables(num_hot=2)}],
                         ids=["dot", "dcn", "adagrad", "hybrid"])
def test_a_dlrm_round_trips_with_its_vocabulary(tmp_path, kwargs):
    model = trained(dlrm(**kwargs)).eval()
    ids = {"item": torch.tensor([[1], [2], [5]]), "last_item": torch.tensor([[0], [3], [4]]),
           "tags": torch.tensor([[1, 2], [4, -1], [-1, -1]])}
    dense = torch.randn(3, 3)
    vocab = ranking_vocab()
    path = model.save_pretrained(tmp_path / "dlrm", vocab)
    loaded = DLRM.from_pretrained(path)
    assert loaded.vocab.cardinalities == vocab.cardinalities and loaded.vocab.fingerprint() == vocab.fingerprint()
    with torch.no_grad():
        assert torch.equal(loaded(dense, SparseFeatures.from_dense(ids)), model(dense, SparseFeatures.from_dense(ids)))
    assert type(load_pretrained(path)) is DLRM


# --------------------------------------------------------------------------- tasks and networks share directories
def next_item_task(vocab: ItemVocab, **kwargs) -> NextItemTask:
    torch.manual_seed(0)
    task = NextItemTask(num_items=NUM_ITEMS, max_length=5, encoder=ElectraEncoder(d_model=8, n_head=2, n_layer=1),
                        objective=ReplacedTokenDetection(), evaluation=Evaluation(top_k=9, exclude_seen=True), **kwargs)
    trained(task)
    task.vocab = vocab
    return task.eval()


def test_a_task_directory_loads_as_its_network(tmp_path, vocab):
    task = next_item_task(vocab)
    path = task.save_pretrained(tmp_path / "model")
    config = read_config(path)
    assert config["version"] == 3 and config["task"]["class_path"] == "sessrec.tasks.next_item.NextItemTask"
    assert config["model"] == config_of(task.model) and config["inference"] == {"max_length": 5, "exclude_seen": True, "top_k": 9}
    loaded = SessionModel.from_pretrained(path)
    with torch.no_grad():
        assert torch.equal(loaded(SESSIONS), task.model(SESSIONS, task.objective))
    assert loaded.vocab == vocab and isinstance(loaded.objective, ReplacedTokenDetection)
    assert NextItemTask.from_pretrained(path).hparams.evaluation == task.hparams.evaluation  # the task section, as before


def test_a_network_directory_loads_as_the_task_that_trains_it(tmp_path, vocab):
    task = next_item_task(vocab)
    network = task.network()
    path = network.save_pretrained(tmp_path / "model")  # the vocabulary, objective and settings the task attached
    assert "task" not in read_config(path)
    for loader in (NextItemTask.from_pretrained, Pretrained.from_pretrained):
        loaded = loader(path)
        assert isinstance(loaded, NextItemTask) and loaded.evaluation.exclude_seen and loaded.evaluation.top_k == 9
        with torch.no_grad():
            assert torch.equal(loaded.model(SESSIONS, loaded.objective), task.model(SESSIONS, task.objective))
        for key, value in task.state_dict().items():  # the generator too: one weights file, the task's keys
            assert torch.equal(loaded.state_dict()[key], value), key


def test_dlrm_task_and_network_read_each_others_directories(tmp_path):
    torch.manual_seed(0)
    vocab = ranking_vocab()
    task = trained(DLRMTask(cardinalities=vocab.cardinalities, num_dense=3,
                            network={"embedding_dim": 4, "dense_layers": [8, 4], "over_layers": [8]})).eval()
    task.vocab = vocab
    network = DLRM.from_pretrained(task.save_pretrained(tmp_path / "task"))
    for key, value in task.model.state_dict().items():
        assert torch.equal(network.state_dict()[key], value), key
    back = DLRMTask.from_pretrained(network.save_pretrained(tmp_path / "network"))
    assert back.hparams.cardinalities == vocab.cardinalities and back.sparse == FusedTables(optimizer="adagrad_rowwise", lr=0.05)
    for key, value in task.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_a_dlrm_with_shared_tables_is_refused_by_the_task_with_one_line(tmp_path):
    path = dlrm().save_pretrained(tmp_path / "dlrm", ranking_vocab())
    with pytest.raises(ConfigError, match=r"config.json: model.init_args.tables: a DLRMTask builds one summed table per "
                                          r".*load the directory with DLRM.from_pretrained$"):
        DLRMTask.from_pretrained(path)


# --------------------------------------------------------------------------- version 1 and 2 directories
def write_old_directory(task: Pretrained, directory: Path, version: int, init_args: dict | None = None) -> Path:
    """A model directory as sessrec wrote it before the networks saved themselves: a task section only
    (the task's settings, or `init_args`)."""
    from safetensors.torch import save_file

    from sessrec.saved.directory import describe, write_description

    directory.mkdir()
    save_file({k: v.contiguous() for k, v in task.state_dict().items()}, str(directory / "model.safetensors"))
    task.vocab.save(directory / "vocab.parquet")
    config = {"format": "sessrec.model", "version": version,
              "task": {"class_path": f"{type(task).__module__}.{type(task).__qualname__}", "init_args": init_args or plain_hparams(task)}}
    if version == 1:
        (directory / "config.json").write_text(json.dumps(config))
    else:
        config["vocab"] = {"fingerprint": task.vocab.fingerprint(), "rows": task.vocab.to_table().num_rows}
        write_description(directory, "config.json", describe(directory, config, ["model.safetensors", "vocab.parquet"]))
    return directory


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_session_model_directory_loads_through_the_task_and_the_network(tmp_path, vocab, version):
    task = next_item_task(vocab)
    path = write_old_directory(task, tmp_path / "old", version)
    with torch.no_grad():
        expected = task.model(SESSIONS, task.objective)
        assert torch.equal(NextItemTask.from_pretrained(path).model(SESSIONS, task.objective), expected)
        network = SessionModel.from_pretrained(path)
        assert torch.equal(network(SESSIONS), expected)
    assert network.inference == Inference(max_length=5, exclude_seen=True, top_k=9) and network.vocab == vocab


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_dlrm_directory_loads_through_the_network(tmp_path, version):
    torch.manual_seed(0)
    task = trained(DLRMTask(cardinalities={"city": 10, "tags": 7}, num_dense=3, network=DLRMNetwork(
        embedding_dim=4, dense_layers=[8, 4], over_layers=[8], interaction="dcn", dcn_rank=2))).eval()
    task.vocab = ranking_vocab()
    flags = {"cardinalities": {"city": 10, "tags": 7}, "num_dense": 3, "embedding_dim": 4, "dense_layers": [8, 4],
             "over_layers": [8], "interaction": "dcn", "dcn_rank": 2, "optimizer": "adam", "lr": 0.001, "ks": [1, 5, 20],
             "embedding_optimizer": "adagrad_rowwise", "embedding_lr": 0.05, "seed": 0, "retain_freed_memory": True}
    network = DLRM.from_pretrained(write_old_directory(task, tmp_path / "old", version, flags))  # as that DLRMTask wrote it
    ids = SparseFeatures.from_dense({"city": torch.tensor([[1], [9]]), "tags": torch.tensor([[0, 6], [2, -1]])})
    dense = torch.randn(2, 3)
    with torch.no_grad():
        assert torch.equal(network(dense, ids), task.model(dense, ids))


def test_the_task_config_translation_builds_the_network_the_task_builds():
    """With every default left out, the sections of a task config describe the very network the task builds."""
    encoder = {"class_path": "sessrec.models.GRU4RecEncoder", "init_args": {"d_model": 8}}
    side = {"categorical": {"device": 4}, "continuous": [], "item_vectors": {}, "looks_ahead": []}
    for extra in ({}, {"side_features": side}):
        args = {"num_items": NUM_ITEMS, "encoder": encoder, "objective": config_of(CausalLanguageModeling()), **extra}
        sections = sections_from_task({"class_path": "sessrec.tasks.NextItemTask", "init_args": args}, "x")
        model, _ = SessionModel.from_sections(sections, "x")
        assert config_of(model) == config_of(NextItemTask(**args).model)
    defaults = sections_from_task({"class_path": "sessrec.tasks.NextItemTask", "init_args": {"num_items": NUM_ITEMS}}, "x")
    assert defaults["inference"] == {"max_length": 20, "exclude_seen": False, "top_k": 20}
    assert defaults["model"]["init_args"]["max_length"] == NextItemTask(num_items=NUM_ITEMS).model.max_length
    args = {"cardinalities": {"city": 10, "tags": 7}, "num_dense": 3}
    dlrm_sections = sections_from_task({"class_path": "sessrec.tasks.DLRMTask", "init_args": args}, "x")
    assert dlrm_sections["model"] == config_of(DLRMTask(**args).model)


# --------------------------------------------------------------------------- refused, in one line
def test_a_directory_of_the_other_network_is_refused_with_one_line(tmp_path, vocab):
    model, objective = session_model("gru4rec_clm")
    session_dir = model.save_pretrained(tmp_path / "session", vocab, objective)
    dlrm_dir = dlrm().save_pretrained(tmp_path / "dlrm", ranking_vocab())
    with pytest.raises(ConfigError, match=r"dlrm/config.json: model: 'sessrec.models.dlrm.DLRM' is a registered class, "
                                          r"but not a SessionModel"):
        SessionModel.from_pretrained(dlrm_dir)
    with pytest.raises(ConfigError, match=r"session/config.json: model: holds a SessionModel, which DLRMTask does not "
                                          r"train; load it with SessionModel.from_pretrained$"):
        DLRMTask.from_pretrained(session_dir)


def test_a_network_directory_the_task_cannot_rebuild_is_refused_with_one_line(tmp_path, vocab):
    model, objective = session_model("sasrec_clm")
    path = model.save_pretrained(tmp_path / "model", vocab, objective, max_length=3)  # the network reads 6 positions
    with pytest.raises(ConfigError, match=r"model.init_args.max_length: the network reads 6 positions and serving 3 "
                                          r"items, .*load the directory with SessionModel.from_pretrained$"):
        NextItemTask.from_pretrained(path)
    assert SessionModel.from_pretrained(path).inference.max_length == 3


@pytest.mark.parametrize("section, value, message", [
    ("inference", {"max_length": 0, "exclude_seen": False, "top_k": 20}, "inference: inference max_length must be an integer >= 1, got 0"),
    ("inference", {"max_length": 5, "top_k": 20, "exclude": True}, "inference: unknown settings ['exclude']"),
    ("objective", {"class_path": "sessrec.models.MaskedItemModeling"}, "objective: MaskedItemModeling predicts hidden items"),
    ("model", {"class_path": "sessrec.tasks.NextItemTask"}, "model: 'sessrec.tasks.NextItemTask' is a registered class, but not a"),
])
def test_bad_network_sections_are_refused_with_one_line(tmp_path, vocab, section, value, message):
    model, objective = session_model("gru4rec_clm")
    path = model.save_pretrained(tmp_path / "model", vocab, objective)
    config = read_config(path)
    config[section] = value
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as info:
        SessionModel.from_pretrained(path)
    assert str(info.value).startswith(f"{path / 'config.json'}: {message}") and "\n" not in str(info.value), str(info.value)


def test_an_old_directory_of_another_task_is_refused_by_the_network_loader(tmp_path, vocab):
    task = next_item_task(vocab)
    path = write_old_directory(task, tmp_path / "old", 2)
    config = read_config(path)
    config["task"]["class_path"] = "sessrec.tasks.baseline.BaselineTask"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"task: 'sessrec.tasks.baseline.BaselineTask': only a NextItemTask's or a "
                                          r"DLRMTask's network is built from its task config here"):
        SessionModel.from_pretrained(path)


def test_saving_without_a_vocabulary_is_refused(tmp_path):
    model, objective = session_model("gru4rec_clm")
    with pytest.raises(ValueError, match="the model has no vocabulary to save"):
        model.save_pretrained(tmp_path / "model", objective=objective)
    assert not (tmp_path / "model").exists()
