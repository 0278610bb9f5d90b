"""Moved modules and renamed names: the old import paths work for one release and warn, the new
paths do not warn, and class paths written before the move (saved files, recipes) still load."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from sessrec.saved.moved import MODULES, NAMES, new_path
from sessrec.saved.registry import instantiate, resolve

torch.set_num_threads(1)

# one name taken from each old module, and where it lives now
OLD_MODULES = {
    "sessrec.data.array_backend": ("as_column", "sessrec.features.backend"),
    "sessrec.data.features": ("Categorify", "sessrec.features"),
    "sessrec.data.features.ops": ("Categorify", "sessrec.features.ops"),
    "sessrec.data.features.pipeline": ("FeaturePipeline", "sessrec.features.pipeline"),
    "sessrec.data.features.time": ("SessionTimeFeatures", "sessrec.features.time"),
    "sessrec.data.trivago": ("TrivagoSource", "sessrec.datasets.trivago"),
    "sessrec.data.clickouts": ("build_clickout_rows", "sessrec.datasets.clickouts"),
    "sessrec.data.criteo": ("generate_criteo", "sessrec.datasets.criteo"),
    "sessrec.data.ranking": ("RankingVocab", "sessrec.datasets.clickout_rows"),
    "sessrec.data.jagged": ("SparseFeatures", "sessrec.embeddings.jagged"),
    "sessrec.data.datamodule": ("SessionDataModule", "sessrec.tasks.session_data"),
    "sessrec.data.ranking_datamodule": ("ClickoutDataModule", "sessrec.tasks.clickout_data"),
    "sessrec.pipeline.features": ("CandidateFeatures", "sessrec.pipeline.candidate_features"),
    "sessrec.pipeline.batch": ("recommend_file", "sessrec.pipeline.offline"),
    "sessrec.pipeline.retrieval.knn": ("BaselineRetriever", "sessrec.pipeline.retrieval.baseline"),
    "sessrec.deploy.metrics": ("Metrics", "sessrec.deploy.request_metrics"),
}


def test_every_moved_module_is_tested():
    assert set(OLD_MODULES) == set(MODULES)


@pytest.mark.parametrize("old", sorted(OLD_MODULES))
def test_an_old_module_path_works_and_warns(old):
    name, new = OLD_MODULES[old]
    if new == "sessrec.deploy.request_metrics":
        pytest.importorskip("prometheus_client")
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {new}\.{name}"):
        found = getattr(module, name)
    assert found is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("old", sorted(NAMES))
def test_an_old_name_works_and_warns(old):
    module, _, name = old.rpartition(".")
    target = NAMES[old]
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {target}"):
        found = getattr(importlib.import_module(module), name)
    new_module, _, new_name = target.rpartition(".")
    assert found is getattr(importlib.import_module(new_module), new_name)


def test_from_import_of_an_old_name_warns():
    with pytest.warns(DeprecationWarning, match="sessrec.data.TrivagoSource moved to sessrec.datasets.trivago"):
        from sessrec.data import TrivagoSource
    from sessrec.datasets import TrivagoSource as new

    assert TrivagoSource is new


def test_from_import_of_the_renamed_request_sessions_warns():
    from sessrec.pipeline.candidates import RequestSessions

    new = r"moved to sessrec\.pipeline\.candidates\.RequestSessions;"
    with pytest.warns(DeprecationWarning, match=rf"^sessrec\.pipeline\.Sessions {new}"):
        from sessrec.pipeline import Sessions
    with pytest.warns(DeprecationWarning, match=rf"^sessrec\.pipeline\.candidates\.Sessions {new}"):
        from sessrec.pipeline.candidates import Sessions as from_module
    assert Sessions is from_module is RequestSessions
    assert Sessions(torch.tensor([[0, 3]])).items.tolist() == [[0, 3]]


def test_the_pipeline_exports_request_sessions_not_sessions():
    import sessrec.pipeline

    assert "RequestSessions" in sessrec.pipeline.__all__ and "Sessions" not in sessrec.pipeline.__all__


def test_request_sessions_pickled_under_the_old_path_loads():
    import pickle

    from sessrec.pipeline.candidates import RequestSessions

    data = pickle.dumps(RequestSessions(torch.tensor([[0, 4, 5]])), protocol=2)  # GLOBAL: "module\nname\n"
    old = data.replace(b"\nRequestSessions\n", b"\nSessions\n")
    assert old != data
    with pytest.warns(DeprecationWarning, match="sessrec.pipeline.candidates.Sessions moved"):
        loaded = pickle.loads(old)
    assert type(loaded) is RequestSessions and loaded.items.tolist() == [[0, 4, 5]]


def test_the_new_paths_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from sessrec.data import SRGNNSource, frame  # noqa: F401 - names that stay in sessrec.data
        from sessrec.datasets import RankingVocab, TrivagoSource, build_clickout_rows, generate_criteo  # noqa: F401
        from sessrec.deploy.export import ExportedClickScorer  # noqa: F401
        from sessrec.embeddings import SparseFeatures  # noqa: F401
        from sessrec.features import Categorify, FeaturePipeline  # noqa: F401
        from sessrec.features.backend import as_column  # noqa: F401
        from sessrec.pipeline import CandidateFeatures, RequestSessions, evaluate_pipeline, recommend_file  # noqa: F401
        from sessrec.pipeline.candidates import RequestSessions as from_module  # noqa: F401
        from sessrec.tasks import ClickoutDataModule, SessionDataModule  # noqa: F401


def test_an_unknown_name_is_still_an_attribute_error():
    import sessrec.data

    with pytest.raises(AttributeError, match="module 'sessrec.data' has no attribute 'Nothing'"):
        sessrec.data.Nothing  # noqa: B018


def test_new_path_of_a_class_path():
    assert new_path("sessrec.pipeline.features.CandidateFeatures") == "sessrec.pipeline.candidate_features.CandidateFeatures"
    assert new_path("sessrec.data.ClickoutDataModule") == "sessrec.tasks.clickout_data.ClickoutDataModule"
    assert new_path("sessrec.pipeline.Sessions") == "sessrec.pipeline.candidates.RequestSessions"
    assert new_path("sessrec.pipeline.candidates.Sessions") == "sessrec.pipeline.candidates.RequestSessions"
    assert new_path("sessrec.data.sources.SRGNNSource") is None


@pytest.mark.parametrize(("old", "new"), [
    ("sessrec.data.features.ops.Categorify", "sessrec.features.ops.Categorify"),
    ("sessrec.data.features.FeaturePipeline", "sessrec.features.pipeline.FeaturePipeline"),
    ("sessrec.pipeline.features.CandidateFeatures", "sessrec.pipeline.candidate_features.CandidateFeatures"),
    ("sessrec.pipeline.retrieval.knn.BaselineRetriever", "sessrec.pipeline.retrieval.baseline.BaselineRetriever"),
    ("sessrec.data.features.time.SessionTimeFeatures", "sessrec.features.time.SessionTimeFeatures"),
])
def test_the_registry_resolves_an_old_class_path(old, new):
    cls = resolve(old, expected=object, source="old.json")
    assert f"{cls.__module__}.{cls.__qualname__}" == new


def test_a_feature_pipeline_saved_under_the_old_paths_loads(tmp_path: Path):
    from sessrec.features import Categorify, FeaturePipeline

    pipe = FeaturePipeline({"c": Categorify("c")}).fit({"c": np.array([5, 5, 7])})
    path = pipe.save(tmp_path / "new.npz")
    with np.load(path) as npz:
        arrays = dict(npz)
    header = arrays["__pipeline__"].tobytes().decode()
    old = header.replace('"sessrec.features.', '"sessrec.data.features.')
    assert old != header and '"sessrec.features.' not in old
    arrays["__pipeline__"] = np.frombuffer(old.encode(), np.uint8)
    np.savez(tmp_path / "old.npz", **arrays)
    loaded = FeaturePipeline.load(tmp_path / "old.npz")
    column = {"c": np.array([7, 5, 9])}
    assert np.array_equal(np.asarray(loaded.transform(column)["c"]), np.asarray(pipe.transform(column)["c"]))


def test_a_pipeline_saved_under_the_old_paths_loads(tmp_path: Path):
    from sessrec.baselines import Popularity
    from sessrec.data import ItemVocab
    from sessrec.deploy.recommender import load_recommender
    from sessrec.pipeline import BaselineRetriever, Pipeline

    vocab = ItemVocab(pa.array(np.arange(100, 120)), np.arange(20, 0, -1))
    sessions = torch.tensor([[0, 2, 3, 4], [5, 6, 6, 8]])
    retrievers = {"pop": (BaselineRetriever(Popularity()).fit(sessions, len(vocab)), 5)}
    directory = Pipeline(vocab, retrievers, max_length=5).save_pretrained(tmp_path / "pipeline")
    request = [["101", "102", "103"], ["110"]]
    expected = load_recommender(directory).recommend(request, k=3)
    described = (directory / "pipeline.json").read_text()
    old = described.replace("sessrec.pipeline.retrieval.baseline.", "sessrec.pipeline.retrieval.knn.")
    assert old != described
    (directory / "pipeline.json").write_text(old)
    assert load_recommender(directory).recommend(request, k=3) == expected


def test_an_old_class_path_instantiates():
    from sessrec.features import Categorify

    config = {"class_path": "sessrec.data.features.ops.Categorify", "init_args": {"column": "c", "min_count": 2}}
    op = instantiate(config, expected=object, source="recipe.yaml")
    assert type(op) is Categorify and op.min_count == 2


def test_a_lightningcli_class_path_under_the_old_package_parses():
    """jsonargparse (LightningCLI's parser) resolves ``sessrec.data.TrivagoSource`` through the shim."""
    from jsonargparse import ArgumentParser

    from sessrec.data import SessionSource
    from sessrec.datasets import TrivagoSource

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--source", type=SessionSource)
    config = '{"class_path": "sessrec.data.TrivagoSource", "init_args": {"path": "log.parquet"}}'
    with pytest.warns(DeprecationWarning, match="sessrec.data.TrivagoSource moved"):
        source = parser.instantiate_classes(parser.parse_args(["--source", config])).source
    assert type(source) is TrivagoSource and source.path == "log.parquet"
