"""The four-stage pipeline end to end on tiny synthetic sessions.

One module-scoped world: `SyntheticSource` sessions split by time (train, then a validation day,
then a test day); a seeded, untrained XLNet task (d_model 16) saved as a model directory (its
`SessionRecommender`) and loaded behind a FAISS HNSW index; V-SKNN and co-visitation fitted on the
training split; two pipelines over these retrievers whose rankers (LightGBM, DLRM) are fitted on
the validation pairs. The tests check that nothing of the test split reaches the fit, that a
saved pipeline recommends exactly as the one in memory, the online and offline (resumable)
entry points, the ``sessrec`` CLI, bad input, and business rules applied through the pipeline.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from sessrec.artifacts import SessionRecommender
from sessrec.baselines import VSKNN
from sessrec.cli import main
from sessrec.data import EvalPairs, ItemVocab, SchemaError, SyntheticSource, frame
from sessrec.data.sources import UserSequenceSource
from sessrec.data.vocab import NUM_SPECIAL
from sessrec.models import HSTUEncoder, SessionModel, XLNetEncoder
from sessrec.pipeline.candidate_features import GROUPS, CandidateFeatures
from sessrec.pipeline.candidates import Candidates, RequestSessions
from sessrec.pipeline.filters import ItemTableFilter, SeenItemsFilter
from sessrec.pipeline.offline import recommend_file
from sessrec.pipeline.ordering import BoostRule, DiversityCap, Ordering, SoftmaxSampling
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.request import check_request
from sessrec.pipeline.retrieval.baseline_retriever import BaselineRetriever
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.pipeline.retrieval.index import FaissIndex
from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever
from sessrec.pipeline.scoring import BlendScorer, DLRMScorer, GBDTScorer
from sessrec.pipeline_training import fitting
from sessrec.pipeline_training.recipe import BaselineRetrieval, ModelRetrieval, PipelineRecipe, index_sessions
from sessrec.saved import versions
from sessrec.saved.directory import write_description
from sessrec.saved.registry import ConfigError, config_of
from sessrec.tasks import NextItemTask, SessionDataModule

torch.set_num_threads(1)
faiss = pytest.importorskip("faiss")
pytest.importorskip("lightgbm")
faiss.omp_set_num_threads(1)

MAX_LENGTH, K = 10, 10
SOURCE = {"num_sessions": 2000, "num_items": 300, "days": 10}  # ~1,570 train, ~210 valid, ~170 test sessions
XLNET = {"d_model": 16, "n_head": 2, "n_layer": 1}
VSKNN_ARGS = {"k": 50, "sample_size": 200}
GBDT_ARGS = {"max_rounds": 20, "threads": 1, "min_data_in_leaf": 5}
UNKNOWN = 99_999_999  # a raw id the vocabulary does not hold


@dataclass
class World:
    dm: SessionDataModule
    model_dir: Path  # the session model's model directory
    retrievers: dict  # name -> (retriever, K), fitted on the training split
    pipelines: dict[str, Pipeline]  # "gbdt" / "dlrm" -> a pipeline whose ranker is fitted
    ranker_pairs: dict[str, EvalPairs]  # what each ranker's fit received
    built_while_fitting: set[str]  # the data module's splits with tensors once the rankers were fitted
    sessions: list[list[int]]  # raw-id sessions of the test split (requests)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    dm = SessionDataModule(source=SyntheticSource(**SOURCE), max_length=MAX_LENGTH)
    torch.manual_seed(0)
    task = NextItemTask(num_items=dm.num_items, max_length=MAX_LENGTH, encoder=XLNetEncoder(**XLNET))
    task.vocab = dm.vocab
    model_dir = task.recommender().save_pretrained(tmp_path_factory.mktemp("model") / "model")

    train, _ = dm.tensors("train")
    vsknn = BaselineRetriever(VSKNN(**VSKNN_ARGS)).fit(train, dm.num_items, frame.end_times(dm.splits.train))
    retrievers = {
        "xlnet": (SessionModelRetriever.from_pretrained(model_dir, FaissIndex("hnsw")), 30),
        "vsknn": (vsknn, 30),
        "covisitation": (CoVisitation().fit(index_sessions(dm), dm.num_items), 30),
    }
    valid = replace(dm.pairs("valid"), times=None)  # the requests of these tests carry no times
    pipelines, pairs = {}, {}
    real_rows = fitting.candidate_rows
    with pytest.MonkeyPatch.context() as patch:  # record the pairs that reach the ranker's features
        for name, scorer in (("gbdt", GBDTScorer(**GBDT_ARGS)), ("dlrm", DLRMScorer(max_epochs=2))):
            features = CandidateFeatures().fit_statistics(index_sessions(dm), dm.num_items)
            pipe = Pipeline(dm.vocab, retrievers, max_length=MAX_LENGTH, max_candidates=50, features=features)

            def rows(pipe, given, batch_size=512, name=name):
                pairs[name] = given
                return real_rows(pipe, given, batch_size)

            patch.setattr(fitting, "candidate_rows", rows)
            fitting.fit_ranker(pipe, valid, scorer)
            pipelines[name] = pipe
    built = set(dm._tensors)
    sessions = dm.splits.test.column("item_id").to_pylist()[:60]
    return World(dm, model_dir, retrievers, pipelines, pairs, built, sessions)


@pytest.fixture(scope="module")
def saved(world: World, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both pipelines saved once, for the offline tests."""
    directory = tmp_path_factory.mktemp("saved")
    return {name: pipe.save_pretrained(directory / name) for name, pipe in world.pipelines.items()}


def pairs_of(items: torch.Tensor, targets: torch.Tensor) -> set[tuple[int, ...]]:
    """Each (prefix, target) row as a tuple."""
    return {tuple(row) for row in torch.cat([items, targets.unsqueeze(1)], dim=1).tolist()}


def small_recipe(world: World, tmp_path: Path, **pipeline) -> PipelineRecipe:
    """A recipe over the world's data module (unless `pipeline` gives its data): V-SKNN and co-visitation, a
    small LightGBM ranker."""
    pipeline.setdefault("data", world.dm)
    return PipelineRecipe(
        baselines={"vsknn": BaselineRetrieval(VSKNN(**VSKNN_ARGS), k=30)},
        covisitation=CoVisitation(), covisitation_k=30, max_candidates=50, scorer=GBDTScorer(**GBDT_ARGS),
        output=str(tmp_path / "pipeline"), **pipeline,
    )


# ------------------------------------------------------------------------------------- leakage
def test_ranker_fits_on_validation_pairs_only(world: World) -> None:
    dm = world.dm
    assert world.built_while_fitting == {"train", "valid"}  # the test split was never even encoded
    valid_items, valid_targets = dm.tensors("valid")
    for given in world.ranker_pairs.values():
        assert torch.equal(given.items, valid_items) and torch.equal(given.targets, valid_targets)
    # 'last' protocol: pair i is validation session i without its last event, which is the target
    valid = dm.splits.valid
    last = pa.array([s[-1] for s in valid.column("item_id").to_pylist()])
    assert valid_targets.long().tolist() == dm.vocab.encode(last).ids.tolist()
    ranker_sessions = set(valid.column("session_id").to_pylist())
    test_sessions = set(dm.splits.test.column("session_id").to_pylist())
    assert len(ranker_sessions) == len(valid_items) and ranker_sessions.isdisjoint(test_sessions)
    # by content: short sessions of popular items ([3, 3]) recur on both days, longer ones do not
    test_pairs = {p for p in pairs_of(*dm.tensors("test")) if len(set(p) - {0}) >= 3}
    assert len(test_pairs) >= 90 and test_pairs.isdisjoint(pairs_of(world.ranker_pairs["gbdt"].items, world.ranker_pairs["gbdt"].targets))


def test_recipe_fit_reads_train_and_valid_only(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dm = world.dm
    requested, ranked = [], []
    real_tensors, real_sessions, real_pairs, real_fit = dm.tensors, dm.sessions, dm.pairs, fitting.fit_ranker

    def tensors(split):
        requested.append(split)
        return real_tensors(split)

    def sessions(split):
        requested.append(split)
        return real_sessions(split)

    def pairs(split, protocol=None, width=None):
        requested.append(split)
        return real_pairs(split, protocol, width)

    def fit_ranker(pipe, pairs, scorer, batch_size=512, **options):
        ranked.append(pairs.items)
        return real_fit(pipe, pairs, scorer, batch_size, **options)

    monkeypatch.setattr(dm, "tensors", tensors)
    monkeypatch.setattr(dm, "sessions", sessions)
    monkeypatch.setattr(dm, "pairs", pairs)
    monkeypatch.setattr("sessrec.pipeline_training.recipe.fit_ranker", fit_ranker)
    model = ModelRetrieval(str(world.model_dir), k=30, index="hnsw")
    recipe = small_recipe(world, tmp_path, models={"xlnet": model})
    recipe.fit()
    assert set(requested) == {"train", "valid"}
    assert len(ranked) == 1 and torch.equal(ranked[0], real_tensors("valid")[0])
    assert set(Pipeline.from_pretrained(recipe.output).retrievers) == {"xlnet", "vsknn", "covisitation"}


def test_recipe_ranker_negatives_sample_the_rankers_rows_and_each_step_prints_one_line(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(ValueError, match="ranker_negatives must be >= 1 candidates per pair .* got 0"):
        small_recipe(world, tmp_path, ranker_negatives=0)
    small_recipe(world, tmp_path, ranker_negatives=5).fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[fit 2/4] fitting the ranker")]
    pairs = len(world.dm.pairs("valid"))
    steps = [line.split(": ", 1)[1] for line in lines[1:-1]]
    assert [step.split(" ")[0] for step in steps] == ["candidates", "feature", steps[2].split(" ")[0], "ranker"]
    assert steps[0].startswith(f"candidates of {pairs:,} pairs") and lines[-1].split(": ")[-1].startswith("done in")
    read = int(steps[2].split("of the ")[1].split(" rows")[0].replace(",", ""))
    assert 0 < read <= 6 * pairs  # the target and 5 other candidates of each pair whose target is among its 50


def test_refit_retrievers_index_the_validation_sessions_once_the_ranker_is_fitted(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dm = world.dm
    indexed, real_fit = [], fitting.fit_ranker

    def fit_ranker(pipe, pairs, scorer, batch_size=512, **options):
        indexed.append(len(pipe.retrievers["vsknn"][0].sessions))  # the index the ranker's rows come from
        return real_fit(pipe, pairs, scorer, batch_size, **options)

    monkeypatch.setattr("sessrec.pipeline_training.recipe.fit_ranker", fit_ranker)
    recipe = small_recipe(world, tmp_path, refit_retrievers=True)
    fitted = recipe.fit()
    train, both = index_sessions(dm), index_sessions(dm, ("train", "valid"))
    assert indexed == [len(train)] and len(both) == len(train) + dm.splits.valid.num_rows
    assert np.array_equal(both[: len(train)], train)  # the validation days come after the training days
    loaded = Pipeline.from_pretrained(recipe.output)
    assert np.array_equal(loaded.retrievers["vsknn"][0].sessions, both)
    covisitation = CoVisitation().fit(both, dm.num_items).state_dict()
    saved = loaded.retrievers["covisitation"][0].state_dict()
    assert saved.keys() == covisitation.keys() and all(np.array_equal(saved[k], covisitation[k]) for k in saved)
    counts = np.bincount(both[both >= NUM_SPECIAL], minlength=dm.num_items)[: dm.num_items]
    assert np.array_equal(loaded.features.popularity[:, 0], counts)
    test = dm.pairs("test")  # with their event times: the ranker has time features
    assert fitting.evaluate_pipeline(loaded, test) == fitting.evaluate_pipeline(fitted, test)
    plain = small_recipe(world, tmp_path / "plain").fit()  # the ranker as fitted: the same in both
    assert config_of(plain.scorer) == config_of(fitted.scorer)
    assert np.array_equal(plain.retrievers["vsknn"][0].sessions, train)


def leave_one_out(tmp_path: Path) -> SessionDataModule:
    """Eight users of 4 to 9 ratings each (a ``user item`` file), split leave-one-out."""
    rng = np.random.default_rng(0)
    lines = {u: rng.choice(np.arange(1, 40), rng.integers(4, 10), replace=False).tolist() for u in range(8)}
    path = tmp_path / "ratings.txt"
    path.write_text("".join(f"{u} {i}\n" for u, items in lines.items() for i in items))
    return SessionDataModule(source=UserSequenceSource(str(path)), max_length=MAX_LENGTH)


def test_refit_sessions_of_leave_one_out_data_hold_each_user_once(tmp_path: Path) -> None:
    """A user's validation sequence is their training sequence one item longer: the retrievers refitted on both
    splits index it once (its longer row), never the test item."""
    dm = leave_one_out(tmp_path)
    both = index_sessions(dm, ("train", "valid"))
    assert sorted(map(tuple, both)) == sorted(map(tuple, dm.sessions("valid").numpy()))


def test_all_prefixes_ranker_pairs_of_leave_one_out_data_are_refused_before_fitting(tmp_path: Path) -> None:
    """Leave-one-out targets only each user's held-out item: every prefix gives no pair more than the last item."""
    recipe = PipelineRecipe(data=leave_one_out(tmp_path), covisitation=CoVisitation(), scorer=GBDTScorer(**GBDT_ARGS),
                            ranker_pairs="all_prefixes", output=str(tmp_path / "pipeline"))
    with pytest.raises(ValueError, match=r"ranker_pairs: all_prefixes gives the ranker no more validation pairs than "
                                         r"each session's last item \(8\) on .*ratings.txt"):
        recipe.fit()
    assert not (tmp_path / "pipeline").exists()
    with pytest.raises(RuntimeError, match="not fitted"):  # refused before the retrievers are fitted
        recipe.covisitation.state_dict()


# ----------------------------------------------------------------------------------- save/load
@pytest.mark.parametrize("scorer", ["gbdt", "dlrm"])
def test_saved_pipeline_recommends_identically(world: World, tmp_path: Path, scorer: str) -> None:
    pipe = world.pipelines[scorer]
    directory = pipe.save_pretrained(tmp_path / "pipeline")
    names = sorted(p.name for p in directory.iterdir())
    assert not [n for n in names if n.endswith((".pkl", ".pickle", ".pt", ".ckpt"))]
    assert {"pipeline.json", "vocab.parquet", "features.safetensors", "scorer.safetensors"} <= set(names)
    spec = json.loads((directory / "pipeline.json").read_text())
    assert spec["version"] == 4 and spec["scorer"]["config"] == config_of(pipe.scorer)
    index = spec["retrievers"][0]["config"]["init_args"]["index"]
    assert (index["class_path"], index["init_args"]["kind"]) == ("sessrec.pipeline.retrieval.index.FaissIndex", "hnsw")
    assert spec["features"]["state"]["names"] == pipe.features.names
    loaded = Pipeline.from_pretrained(directory)
    before, after = pipe.recommend(world.sessions, k=K), loaded.recommend(world.sessions, k=K)
    assert after == before
    assert all(len(r["item_ids"]) == K for r in before)


def test_a_blend_ranker_saves_and_loads_with_its_members(world: World, tmp_path: Path) -> None:
    dm = world.dm
    features = CandidateFeatures().fit_statistics(index_sessions(dm), dm.num_items)
    pipe = Pipeline(dm.vocab, world.retrievers, max_length=MAX_LENGTH, max_candidates=50, features=features)
    blend = BlendScorer([DLRMScorer(max_epochs=1), GBDTScorer(**GBDT_ARGS)])
    fitting.fit_ranker(pipe, replace(dm.pairs("valid"), times=None), blend)  # requests without times
    dlrm = blend.scorers[0]  # its tables span the vocabulary and the cross's buckets, whatever the rows held
    assert (dlrm.rows["item"].vocabulary, dlrm.rows["cross"].vocabulary) == (dm.num_items, features.cross_buckets)
    directory = pipe.save_pretrained(tmp_path / "blend")
    loaded = Pipeline.from_pretrained(directory)
    assert config_of(loaded.scorer) == config_of(blend)
    assert loaded.recommend(world.sessions, k=K) == pipe.recommend(world.sessions, k=K)


def test_a_retriever_with_a_scalar_in_its_state_loads_as_saved(world: World, tmp_path: Path) -> None:
    """An HSTU's state holds a 0-d tensor (whether it trained with times); saved as (1,) it loaded into no model,
    so a pipeline that `sessrec fit` had saved was refused by test, recommend and serve."""
    torch.manual_seed(0)
    model = SessionModel(world.dm.num_items, HSTUEncoder(d_model=8, n_head=2, n_layer=1), max_length=MAX_LENGTH)
    model.encoder.trained_with_times = True
    pipe = Pipeline(world.dm.vocab, {"hstu": (SessionModelRetriever(model), K)}, max_length=MAX_LENGTH)
    sessions, times = world.sessions[:4], [[1.7e9 + 60 * i for i in range(len(s))] for s in world.sessions[:4]]
    loaded = Pipeline.from_pretrained(pipe.save_pretrained(tmp_path / "pipeline"))
    assert loaded.retrievers["hstu"][0].model.encoder.trained_with_times is True
    assert loaded.recommend(sessions, k=K, times=times) == pipe.recommend(sessions, k=K, times=times)


def test_saving_again_adds_a_version_and_never_replaces_other_files(world: World, tmp_path: Path) -> None:
    target = tmp_path / "pipeline"
    world.pipelines["gbdt"].save_pretrained(target)
    assert (target / "pipeline.json").exists()
    world.pipelines["gbdt"].save_pretrained(target)
    assert (target / "CURRENT").read_text().strip() == "v000002" and not (target / "pipeline.json").exists()
    assert set(Pipeline.from_pretrained(target).retrievers) == set(world.pipelines["gbdt"].retrievers)
    assert list(tmp_path.iterdir()) == [target]  # no temporary folder left beside it
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("not a pipeline")
    with pytest.raises(FileExistsError, match="is not a saved model or pipeline directory"):
        world.pipelines["gbdt"].save_pretrained(other)
    assert [p.name for p in other.iterdir()] == ["mine.txt"]


def test_saved_rules_load_without_their_files(world: World, tmp_path: Path) -> None:
    raw = world.dm.vocab.raw_ids.to_pylist()
    deny, categories = tmp_path / "deny.parquet", tmp_path / "categories.parquet"
    pq.write_table(pa.table({"item_id": raw[:20]}), deny)
    pq.write_table(pa.table({"item_id": raw[:60], "category": [f"c{i % 3}" for i in range(60)]}), categories)
    ordering = Ordering([BoostRule(raw[20:25], 0.5), BoostRule(str(deny), 2.0, "multiply")],
                        DiversityCap(str(categories), 2), SoftmaxSampling(0.5, seed=1))
    pipe = Pipeline(world.dm.vocab, {"covisitation": world.retrievers["covisitation"]}, max_length=MAX_LENGTH,
                    filters=[SeenItemsFilter(window=2), ItemTableFilter(str(deny))], ordering=ordering)
    expected = pipe.recommend(world.sessions, k=K)  # the first sample of the seeded sampler, as a loaded pipeline's
    assert any(len(r["item_ids"]) for r in expected)
    current = pipe.save_pretrained(tmp_path / "v3")
    deny.unlink()
    categories.unlink()
    loaded = Pipeline.from_pretrained(current)
    assert loaded.recommend(world.sessions, k=K) == expected
    assert [r.num_unknown for r in loaded.ordering.rules] == [r.num_unknown for r in ordering.rules]


def test_failing_save_leaves_nothing_and_keeps_the_old_pipeline(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe = world.pipelines["gbdt"]

    def broken():
        raise OSError("disk full")

    monkeypatch.setattr(pipe.scorer, "state_dict", broken)
    with pytest.raises(OSError, match="disk full"):
        pipe.save_pretrained(tmp_path / "new")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    old = pipe.save_pretrained(tmp_path / "old")
    monkeypatch.setattr(pipe.scorer, "state_dict", broken)
    with pytest.raises(OSError, match="disk full"):
        pipe.save_pretrained(old)
    assert list(tmp_path.iterdir()) == [old]
    assert Pipeline.from_pretrained(old).recommend(world.sessions[:5], k=K) == pipe.recommend(world.sessions[:5], k=K)


# ---------------------------------------------------------------------------------- online use
@pytest.mark.parametrize("scorer", ["gbdt", "dlrm"])
def test_recommend_takes_and_returns_raw_ids(world: World, scorer: str) -> None:
    pipe = world.pipelines[scorer]
    known = set(pipe.vocab.raw_ids.to_pylist())
    recs = pipe.recommend(world.sessions, k=K)
    assert len(recs) == len(world.sessions)
    for rec in recs:
        assert len(rec["item_ids"]) == K == len(set(rec["item_ids"]))
        assert set(rec["item_ids"]) <= known
        assert rec["scores"] == sorted(rec["scores"], reverse=True) and all(map(math.isfinite, rec["scores"]))
    # the synthetic transitions are learnable: the ranked lists find most next items of the test day
    # times given, no time features: ignored
    metrics = fitting.evaluate_pipeline(pipe, world.dm.pairs("test"), ks=(10,))
    assert 0.6 < metrics["recall@10"] <= metrics["candidate_recall"] <= 1.0
    assert 0.2 < metrics["mrr@10"] < metrics["recall@10"]


def test_recommend_unknown_and_empty_sessions(world: World) -> None:
    pipe = world.pipelines["gbdt"]
    first = world.sessions[0]
    with pytest.raises(ValueError, match=f"item id {UNKNOWN} is not in the model's vocabulary"):
        pipe.recommend([first, [*first, UNKNOWN]], k=K, on_unknown="error")
    with pytest.raises(ValueError, match="session 1 is empty: give at least one item id"):
        pipe.recommend([first, []], k=K)
    recs = pipe.recommend([[UNKNOWN], [*first, UNKNOWN]], k=K)
    assert [len(r["item_ids"]) for r in recs] == [K, K]


# ------------------------------------------------------------------------------- offline batch
def write_requests(world: World, path: Path, layout: str = "lists") -> list[int]:
    """300 sessions (validation and test days, one with an unknown id), ids descending; returns the ids."""
    splits = world.dm.splits
    lists = (splits.valid.column("item_id").to_pylist() + splits.test.column("item_id").to_pylist())[:300]
    lists[7] = [*lists[7], UNKNOWN]
    ids = list(range(5000, 5000 - len(lists), -1))
    if layout == "lists":
        pq.write_table(pa.table({"session_id": ids, "item_id": lists}), path)
    else:
        sid = [s for s, items in zip(ids, lists) for _ in items]
        pacsv.write_csv(pa.table({"session_id": sid, "item_id": [i for items in lists for i in items]}), path)
    return ids


def kill_after_two_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `Pipeline.recommend_batch` fail on its third call, as a run killed after two parts would."""
    real, calls = Pipeline.recommend_batch, []

    def killed_after_two(self, sessions, k=20):
        if len(calls) == 2:
            raise RuntimeError("killed")
        calls.append(len(sessions))
        return real(self, sessions, k)

    monkeypatch.setattr(Pipeline, "recommend_batch", killed_after_two)


def test_recommend_file_resumes_after_a_kill(
    world: World, saved: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = saved["gbdt"]
    src = tmp_path / "sessions.parquet"
    ids = write_requests(world, src)
    whole = recommend_file(saved, src, tmp_path / "whole.parquet", k=5, batch_size=64, partition_batches=1)
    assert (whole["sessions"], whole["partitions_written"], whole["partitions_resumed"]) == (300, 5, 0)
    assert whole["unknown_items"] >= 1
    expected = pq.read_table(tmp_path / "whole.parquet")
    assert expected.column("session_id").to_pylist() == ids
    # the same object online, over the same batches (the trees can flip on a last-bit difference of
    # the session model's scores, which a batch of another size may give)
    lists, pipe = pq.read_table(src).column("item_id").to_pylist(), Pipeline.from_pretrained(saved)
    online = [r for lo in range(0, len(lists), 64) for r in pipe.recommend(lists[lo : lo + 64], k=5)]
    assert expected.select(["item_ids", "scores"]).to_pylist() == online

    out = tmp_path / "recs.parquet"
    parts = tmp_path / "recs.parquet.parts"
    kill_after_two_batches(monkeypatch)
    with pytest.raises(RuntimeError, match="killed"):
        recommend_file(saved, src, out, k=5, batch_size=64, partition_batches=1)
    assert not out.exists()
    complete = ["manifest.json", "part-000000.parquet", "part-000001.parquet"]  # no part-000002.parquet.tmp
    assert sorted(p.name for p in parts.iterdir()) == complete
    monkeypatch.undo()
    counts = recommend_file(saved, src, out, k=5, batch_size=64, partition_batches=1)
    assert (counts["sessions"], counts["partitions_written"], counts["partitions_resumed"]) == (300, 3, 2)
    assert pq.read_table(out).equals(expected) and not parts.exists()
    with pytest.raises(FileExistsError, match="recs.parquet exists"):
        recommend_file(saved, src, out, k=5, batch_size=64)


def test_recommend_file_starts_over_when_the_pipeline_was_refitted_in_place(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    directory, src, out = tmp_path / "pipeline", tmp_path / "sessions.parquet", tmp_path / "recs.parquet"
    write_requests(world, src)
    world.pipelines["gbdt"].save_pretrained(directory)
    kill_after_two_batches(monkeypatch)
    with pytest.raises(RuntimeError, match="killed"):
        recommend_file(directory, src, out, k=5, batch_size=64, partition_batches=1)
    monkeypatch.undo()
    world.pipelines["dlrm"].save_pretrained(directory)  # re-fitted in place, same path, same input
    counts = recommend_file(directory, src, out, k=5, batch_size=64, partition_batches=1)
    assert (counts["partitions_written"], counts["partitions_resumed"]) == (5, 0)
    assert "written by another model, input or settings; starting over" in capsys.readouterr().out
    fresh = recommend_file(Pipeline.from_pretrained(directory), src, tmp_path / "fresh.parquet", k=5,
                           batch_size=64, partition_batches=1)
    assert fresh["partitions_resumed"] == 0
    assert pq.read_table(out).equals(pq.read_table(tmp_path / "fresh.parquet"))


def test_recommend_file_reads_one_row_per_event(world: World, saved: dict[str, Path], tmp_path: Path) -> None:
    lists, events = tmp_path / "sessions.parquet", tmp_path / "events.csv"
    ids = write_requests(world, lists)
    write_requests(world, events, layout="events")
    # both layouts give the same batches (cut every 64 sessions, whatever the chunks), so the same output
    recommend_file(saved["dlrm"], lists, tmp_path / "from_lists.parquet", k=5, batch_size=64)
    counts = recommend_file(saved["dlrm"], events, tmp_path / "from_events.parquet", k=5, batch_size=64)
    assert counts["sessions"] == 300
    got, expected = (pq.read_table(tmp_path / f"from_{name}.parquet") for name in ("events", "lists"))
    assert got.column("session_id").to_pylist() == ids
    assert got.equals(expected)


# -------------------------------------------------------------------------------------------- CLI
def write_recipe(world: World, tmp_path: Path, **extra) -> tuple[Path, Path]:
    """A pipeline recipe without a session model (no checkpoint needed); returns it and its output."""
    output = tmp_path / "pipeline"
    scorer = {"class_path": "sessrec.pipeline.scoring.GBDTScorer", "init_args": GBDT_ARGS}
    baseline = {"class_path": "sessrec.baselines.VSKNN", "init_args": VSKNN_ARGS}
    block = {
        "data": {"source": {"class_path": "sessrec.data.SyntheticSource", "init_args": SOURCE},
                 "max_length": MAX_LENGTH},
        "baselines": {"vsknn": {"baseline": baseline, "k": 30}}, "covisitation": {}, "covisitation_k": 30,
        "max_candidates": 50, "scorer": scorer, "output": str(output), **extra,
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"pipeline": block}))
    return path, output


def sessrec(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["sessrec", *map(str, args)])
    main()


@pytest.mark.slow
def test_cli_fit_test_recommend(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    untimed = {"groups": [g for g in GROUPS if g != "time"]}  # the requests file below has no time column
    recipe, output = write_recipe(world, tmp_path, features=untimed)
    sessrec(monkeypatch, "fit", "--config", recipe)
    assert (output / "pipeline.json").exists()
    sessrec(monkeypatch, "test", "--config", recipe)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("[test] "))
    metrics = {name: float(value) for name, value in (kv.split("=") for kv in line.split()[1:])}
    assert {"recall@10", "mrr@10", "ndcg@20", "candidate_recall"} <= set(metrics)
    assert all(0.0 <= v <= 1.0 for v in metrics.values()) and metrics["mrr@20"] <= metrics["recall@20"]
    src, out = tmp_path / "sessions.parquet", tmp_path / "recs.parquet"
    ids = write_requests(world, src)
    sessrec(monkeypatch, "recommend", "--config", recipe, "--input_path", src, "--output", out, "--k", "5")
    recs = pq.read_table(out)
    assert recs.column("session_id").to_pylist() == ids
    assert all(len(items) == 5 for items in recs.column("item_ids").to_pylist())
    at = tmp_path / "at.parquet"  # a request time for every session (no rule table here: the same lists)
    sessrec(monkeypatch, "recommend", "--config", recipe, "--input_path", src, "--output", at, "--k", "5", "--now", "1700000000")
    assert pq.read_table(at).equals(recs)
    with pytest.raises(SystemExit) as exit:
        sessrec(monkeypatch, "recommend", "--config", recipe, "--input_path", src, "--output", tmp_path / "ms.parquet",
                "--now", "1700000000000")
    assert str(exit.value.code).startswith("sessrec recommend: error: now 1700000000000 is not a time in seconds since")


@pytest.mark.parametrize("kind", ["file", "other folder", "under a file"])
def test_a_pipeline_output_it_cannot_save_into_is_refused_before_fitting(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """`sessrec fit` checks `pipeline.output` before reading the data or fitting anything, not when saving."""
    blocker = tmp_path / "taken"
    if kind == "other folder":
        blocker.mkdir()
        (blocker / "notes.txt").write_text("mine")
    else:
        blocker.write_text("a file")
    output = blocker / "pipeline" if kind == "under a file" else blocker
    recipe, _ = write_recipe(world, tmp_path, output=str(output))
    monkeypatch.setattr(PipelineRecipe, "build", lambda self: pytest.fail("fitted before the output was checked"))
    with pytest.raises(SystemExit) as exit:
        sessrec(monkeypatch, "fit", "--config", recipe)
    expected = (f"{output}: {blocker} is a file, not a folder" if kind == "under a file" else
                f"{output}: exists and is not a saved model or pipeline directory")
    assert str(exit.value.code).startswith(f"sessrec fit: error: {expected}; save into a new or empty folder")


@pytest.mark.parametrize("command", ["test", "recommend"])
@pytest.mark.parametrize("flag", [("seen_filter", "session"), ("max_candidates", "3"), ("covisitation_k", "1"),
                                  ("baselines.vsknn.k", "1"), ("device", "cpu")])
def test_settings_of_the_fit_are_refused_by_test_and_recommend(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, flag: tuple[str, str]
) -> None:
    """`sessrec test` and `recommend` read the saved pipeline as fitted: a flag of its fit would be ignored, so it is
    refused in one line before anything is read or written."""
    recipe, output = write_recipe(world, tmp_path)
    out = tmp_path / "recs.parquet"
    extra = ["--input_path", tmp_path / "sessions.parquet", "--output", out] if command == "recommend" else []
    with pytest.raises(SystemExit) as exit:
        sessrec(monkeypatch, command, "--config", recipe, *extra, f"--pipeline.{flag[0]}", flag[1])
    key = flag[0].split(".")[0]
    assert str(exit.value.code) == (
        f"sessrec {command}: error: --pipeline.{key}: sessrec {command} reads the pipeline saved at {output} as it was "
        "fitted, and this setting only when fitting; refit it (sessrec fit) to change it, or drop the flag "
        f"({command} reads {'pipeline.data, pipeline.output, pipeline.ks, pipeline.batch_size' if command == 'test' else 'pipeline.data, pipeline.output'}) "
        "(--traceback for details)"
    )
    assert not output.exists() and not out.exists()


@pytest.mark.parametrize(
    ("columns", "block", "missing"),
    [
        ({"sku": [1000]}, lambda path: {"item_tables": [{"path": path}]}, "item_id"),
        (
            {"item_id": [1000]},
            lambda path: {"ordering": {"diversity": {"category_path": path, "max_per_category": 1}}},
            "category",
        ),
    ],
    ids=["item-table", "category-table"],
)
def test_cli_bad_recipe_table_is_one_line(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: dict, block, missing: str
) -> None:
    table = tmp_path / "rules.parquet"
    pq.write_table(pa.table(columns), table)
    recipe, output = write_recipe(world, tmp_path, **block(str(table)))
    with pytest.raises(SystemExit) as exit:
        sessrec(monkeypatch, "fit", "--config", recipe)
    message = str(exit.value.code)
    assert message.startswith("sessrec fit: error: ") and "\n" not in message
    assert str(table) in message and f"column {missing!r} is missing" in message
    assert not output.exists()


# ------------------------------------------------------------------------------------- bad input
def test_load_refuses_a_directory_that_is_not_a_pipeline(world: World, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}: not a saved pipeline"):
        Pipeline.from_pretrained(tmp_path)
    directory = world.pipelines["gbdt"].save_pretrained(tmp_path / "pipeline")
    spec = json.loads((directory / "pipeline.json").read_text())
    (directory / "pipeline.json").write_text(json.dumps({**spec, "version": 99}))
    with pytest.raises(ValueError, match="pipeline.json: a pipeline of format version 99, which this sessrec does not read"):
        Pipeline.from_pretrained(directory)


def test_model_with_another_vocabulary_is_refused(world: World, tmp_path: Path) -> None:
    mine = SessionRecommender.from_pretrained(world.model_dir)
    size = len(mine.vocab) - 2
    vocab = ItemVocab(pa.array(np.arange(10_000, 10_000 + size)), np.ones(size, dtype=np.int64))  # as many ids, other items
    other = SessionRecommender(mine.model, mine.objective, vocab, mine.inference).save_pretrained(tmp_path / "other")
    recipe = small_recipe(world, tmp_path, models={"xlnet": ModelRetrieval(str(world.model_dir)),
                                                   "other": ModelRetrieval(str(other))})
    with pytest.raises(ValueError, match=rf"^models.other.model_dir: {other}: its vocabulary differs from the pipeline's"):
        recipe.build()


def test_the_stage_1_vocabulary_is_read_from_the_model_directory(world: World, tmp_path: Path) -> None:
    dm = SessionDataModule(source=SyntheticSource(**SOURCE), max_length=MAX_LENGTH)
    recipe = PipelineRecipe(data=dm, models={"xlnet": ModelRetrieval(str(world.model_dir))}, output=str(tmp_path / "p"))
    recipe.stage1_vocabulary()
    assert dm.vocab_path == str(world.model_dir / "vocab.parquet") and dm.vocab == world.dm.vocab


def test_a_recipes_model_retriever_runs_its_query_where_the_recipe_says(world: World, tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    recipe = PipelineRecipe(data=world.dm, models={"xlnet": ModelRetrieval(str(world.model_dir), k=30, runtime="onnxruntime")},
                            output=str(tmp_path / "p"))
    retriever, k = recipe.retrievers({"xlnet"}, index_sessions(world.dm))["xlnet"]
    eager = world.retrievers["xlnet"][0]
    assert (retriever.runtime, eager.runtime, k) == ("onnxruntime", "torch", 30)
    request = RequestSessions(world.dm.tensors("test")[0][:40].long())
    torch.testing.assert_close(retriever.query_vectors(request), eager.query_vectors(RequestSessions(request.items)),
                               rtol=0, atol=2e-5)


def with_data(world: World, directory: Path, **changes) -> Path:
    """The world's model written again with a data section (what sessrec fit records): the world's data
    module's configuration, with `changes` to its init_args."""
    recommender = SessionRecommender.from_pretrained(world.model_dir)
    data = config_of(world.dm)
    data["init_args"].update(changes)
    recommender.data = data
    return recommender.save_pretrained(directory)


def edit_data(directory: Path, data: object) -> None:
    """Put `data` as the data section of the current version of a model directory (its content hash recomputed)."""
    folder = versions.resolve(directory)
    config = json.loads((folder / "config.json").read_text())
    config["data"] = data
    write_description(folder, "config.json", config)


def fitted_metrics(recipe: PipelineRecipe) -> dict[str, float]:
    """Build the recipe's pipeline, fit its ranker on the validation pairs, score the test pairs."""
    pipe = recipe.build()
    fitting.fit_ranker(pipe, recipe.ranker_data(), recipe.scorer)
    return fitting.evaluate_pipeline(pipe, recipe.data.pairs("test"), recipe.ks)


def test_a_recipe_without_data_reads_the_sessions_of_its_model_directory(world: World, tmp_path: Path) -> None:
    model_dir = with_data(world, tmp_path / "model", batch_size=7)  # a setting that only shapes training batches
    assert SessionRecommender.from_pretrained(model_dir).data == config_of(world.dm) | {
        "init_args": {**config_of(world.dm)["init_args"], "batch_size": 7}}

    def recipe(data: SessionDataModule | None) -> PipelineRecipe:
        return small_recipe(world, tmp_path, data=data, models={"xlnet": ModelRetrieval(str(model_dir), k=30)})

    read = recipe(None)
    assert type(read.data.source) is SyntheticSource and config_of(read.data.source) == config_of(world.dm.source)
    assert read.data.max_length == MAX_LENGTH and read.data.vocab_path == str(model_dir / "vocab.parquet")
    written = recipe(SessionDataModule(source=SyntheticSource(**SOURCE), max_length=MAX_LENGTH))
    got, expected = fitted_metrics(read), fitted_metrics(written)
    assert got == expected and got["recall@20"] > 0


@pytest.mark.parametrize("data, message", [
    ({"class_path": "os.system", "init_args": {"command": "touch pwned"}},
     r"data: 'os.system' is not registered; import the module that defines it"),
    ({"class_path": "sessrec.tasks.SessionDataModule", "init_args": {"source": {"class_path": "pipeline_sentinel.Thing"}}},
     r"data.init_args.source: 'pipeline_sentinel.Thing' is not registered"),
    ({"class_path": "sessrec.tasks.SessionDataModule", "init_args": {"source": {"class_path": "sessrec.models.GRU4RecEncoder"}}},
     r"data.init_args.source: 'sessrec.models.GRU4RecEncoder' is a registered class, but not a SessionSource"),
], ids=["function", "unimported-module", "not-a-source"])
def test_a_hostile_data_section_is_refused_before_anything_is_imported(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict, message: str
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "pipeline_sentinel.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n\n\nclass Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    monkeypatch.chdir(tmp_path)
    model_dir = with_data(world, tmp_path / "model")
    edit_data(model_dir, data)
    recipe = small_recipe(world, tmp_path, data=None, models={"xlnet": ModelRetrieval(str(model_dir))})
    with pytest.raises(ConfigError, match=rf"^{versions.resolve(model_dir) / 'config.json'}: {message}"):
        _ = recipe.data  # read on first use
    assert not marker.exists() and "pipeline_sentinel" not in sys.modules and not (tmp_path / "pwned").exists()


def test_models_trained_on_other_sessions_are_refused_naming_the_key(world: World, tmp_path: Path) -> None:
    first = with_data(world, tmp_path / "first")
    other = with_data(world, tmp_path / "other", max_length=MAX_LENGTH - 1)
    recipe = small_recipe(world, tmp_path, data=None, models={"a": ModelRetrieval(str(first)), "b": ModelRetrieval(str(other))})
    with pytest.raises(ValueError, match=(
        rf"^models.b.model_dir: {other} was trained on other sessions than models.a.model_dir: {first} "
        r"\(data.init_args.max_length differs\); a pipeline's models share their sessions: give pipeline.data")):
        _ = recipe.data  # read on first use
    source = {**config_of(world.dm.source)["init_args"], "num_items": 301}
    edit_data(other, config_of(world.dm) | {"init_args": {**config_of(world.dm)["init_args"], "source": {
        "class_path": "sessrec.data.sources.SyntheticSource", "init_args": source}}})
    recipe = small_recipe(world, tmp_path, data=None, models={"a": ModelRetrieval(str(first)), "b": ModelRetrieval(str(other))})
    with pytest.raises(ValueError, match=r"\(data.init_args.source.init_args.num_items differs\)"):
        _ = recipe.data  # read on first use
    # only training-batch settings differ: the same sessions
    same = with_data(world, tmp_path / "same", batch_size=3, eval_batch_size=5, train_prefixes=True, augment_reversed=True)
    recipe = small_recipe(world, tmp_path, data=None, models={"a": ModelRetrieval(str(first)), "b": ModelRetrieval(str(same))})
    assert recipe.data.vocab_path == str(first / "vocab.parquet")


def test_a_recipe_without_data_and_a_model_directory_without_it_is_refused(world, tmp_path, sessrec_main) -> None:
    needs = ("a pipeline recipe reads its sessions from pipeline.data or from its models' model directories: give "
             "pipeline.data (the stage-1 recipe's data block) or models.<name>.model_dir, a model directory written by sessrec fit")
    recipe = small_recipe(world, tmp_path, data=None, models={"xlnet": ModelRetrieval(str(world.model_dir))})
    with pytest.raises(ValueError) as err:
        recipe.build()
    assert str(err.value) == f"models.xlnet.model_dir: {world.model_dir} records no data section: {needs}"
    recipe_file, _ = write_recipe(world, tmp_path, data=None, models={"xlnet": {"model_dir": str(world.model_dir), "k": 30}})
    assert sessrec_main("fit", "--config", str(recipe_file)) == (
        f"sessrec fit: error: models.xlnet.model_dir: {world.model_dir} records no data section: {needs} (--traceback for details)")
    with pytest.raises(ValueError) as err:
        small_recipe(world, tmp_path, data=None)  # baselines only: no model directory to read
    assert str(err.value) == needs


@pytest.mark.parametrize("keys", [{"recipe": "recipes/xlnet_mlm_rsc15.yaml", "checkpoint": "runs/x/checkpoints/best.ckpt"},
                                  {"checkpoint": "runs/x/checkpoints/best.ckpt"}])
def test_a_model_named_by_recipe_and_checkpoint_is_refused_in_one_line(world, tmp_path, sessrec_main, keys) -> None:
    recipe, _ = write_recipe(world, tmp_path, models={"xlnet": {**keys, "k": 30}})
    assert sessrec_main("fit", "--config", str(recipe)) == (
        f"sessrec fit: error: {recipe}: pipeline.models.xlnet: a pipeline takes the model directory that sessrec fit "
        "writes, not a recipe and a checkpoint: model_dir: runs/<name>/model (--traceback for details)")


def test_a_model_seed_that_no_training_can_have_or_an_empty_model_dir_is_refused(world: World, tmp_path: Path) -> None:
    for seed in (-1, 2**32):
        with pytest.raises(ValueError, match=f"models.again.seed: {seed} is not a --seed_everything value"):
            small_recipe(world, tmp_path, models={"again": ModelRetrieval(str(world.model_dir), seed=seed)})
    assert small_recipe(world, tmp_path, models={"again": ModelRetrieval(str(world.model_dir), seed=1)})
    with pytest.raises(ValueError, match=r"models.again.model_dir is empty: give the model directory"):
        small_recipe(world, tmp_path, models={"again": ModelRetrieval(" ")})  # not read as the working directory


def test_a_recipe_setting_that_only_another_setting_reads_is_refused_without_it(tmp_path: Path) -> None:
    """seen_window without seen_filter: window, covisitation_k without covisitation: both were ignored silently."""
    def recipe(**pipeline) -> PipelineRecipe:
        return PipelineRecipe(models={"m": ModelRetrieval("runs/m/model")}, output=str(tmp_path / "p"), **pipeline)

    for seen_filter in ("none", "session"):
        with pytest.raises(ValueError, match=rf"^seen_window: 3 is the window of seen_filter: window, and seen_filter is "
                                             rf"{seen_filter}: set seen_filter: window, or drop seen_window$"):
            recipe(seen_filter=seen_filter, seen_window=3)
    for bad in (0, -2):
        with pytest.raises(ValueError, match=rf"^seen_window: {bad} is not a number of events"):
            recipe(seen_filter="window", seen_window=bad)
    assert recipe(seen_filter="window").seen_window == 1 and recipe(seen_filter="window", seen_window=4).seen_window == 4
    with pytest.raises(ValueError, match=r"^covisitation_k: 20 is the candidates of the co-visitation retriever, and the "
                                         r"recipe has none: add covisitation: \{\} \(its settings\), or drop covisitation_k$"):
        recipe(covisitation_k=20)
    assert recipe(covisitation=CoVisitation()).covisitation_k == 100
    assert recipe(covisitation=CoVisitation(), covisitation_k=7).covisitation_k == 7


@pytest.mark.parametrize("max_candidates", [0, -3])
def test_no_candidates_are_refused_when_the_recipe_is_built(tmp_path: Path, max_candidates: int) -> None:
    """max_candidates 0 was read when the pipeline was built, after the data and the retrievers, and failed in a reshape."""
    with pytest.raises(ValueError, match=rf"^max_candidates must be an integer >= 1, got {max_candidates}$"):
        PipelineRecipe(models={"m": ModelRetrieval("runs/m/model")}, output=str(tmp_path / "p"), max_candidates=max_candidates)


@pytest.mark.parametrize("ks", [[0], [2.5], [], [10, -1]])
def test_cutoffs_that_are_no_positive_integers_are_refused_when_the_recipe_is_built(tmp_path: Path, ks) -> None:
    """The printed metrics' cut-offs were read first when the fitted pipeline scored the validation pairs: after the
    retrievers and the ranker had been fitted, as a metric name no formula knows or a traceback."""
    with pytest.raises(ValueError, match=rf"^ks must be positive integer cut-offs, got {re.escape(str(ks))}$"):
        PipelineRecipe(models={"m": ModelRetrieval("runs/m/model")}, output=str(tmp_path / "p"), ks=ks)
    assert PipelineRecipe(models={"m": ModelRetrieval("runs/m/model")}, output=str(tmp_path / "p"), ks=[20, 5]).ks == [5, 20]


def test_category_table_without_its_column_names_file_and_column(tmp_path: Path) -> None:
    table = tmp_path / "categories.csv"
    pacsv.write_csv(pa.table({"item_id": [1000], "cat": ["shoes"]}), table)
    with pytest.raises(SchemaError, match=rf"{table}: column 'category' is missing"):
        DiversityCap(str(table), max_per_category=1).read()


# ------------------------------------------------------------------------------------ features
def test_session_features_do_not_depend_on_left_padding(world: World) -> None:
    features = world.pipelines["gbdt"].features
    cands = Candidates(torch.tensor([[5, 7, 9]]))
    rows = ([[5, 5, 7]], [[0, 0, 5, 5, 7]])  # one session, as a full row and left-padded
    full, padded = (features.raw(RequestSessions(torch.tensor(r)), cands, {}) for r in rows)
    assert full["session_distinct"].tolist() == [[pytest.approx(2 / 3)] * 3]  # 2 distinct items in 3 events
    assert full["seen_count"].tolist() == [[2, 1, 0]] and full["seen_recency"].tolist() == [[0.5, 1, 0]]
    # seen_weight weighs positions over the matrix width: the pipeline always passes max_length columns
    for name in set(full) - {"seen_weight"}:
        assert torch.equal(full[name], padded[name]), name


def test_candidate_decided_features_gathered_from_item_tables_equal_the_ops_own(world: World) -> None:
    """The popularity logs and the item encodings are gathered from per-item tables (`item_tables`) at
    request time: bit for bit what the ops give the candidates' rows."""
    pipe = world.pipelines["gbdt"]
    features = copy.deepcopy(pipe.features)
    assert sorted(features.item_tables()) == ["item_candidate_count", "item_target", "popularity_log", "recent_popularity_log"]
    sessions = pipe.encode(check_request(world.sessions[:30], K))
    cands = pipe.candidates(sessions)
    gathered = features.transform(sessions, cands, pipe.stage_retrievers)
    features._tables = (features.ops, features.popularity, {})  # the ops run on the candidates' rows
    computed = features.transform(sessions, cands, pipe.stage_retrievers)
    assert features.item_tables() == {} and gathered.names == computed.names
    assert torch.equal(gathered.dense, computed.dense)
    assert gathered.dense[..., gathered.names.index("item_target")].std() > 0


def test_popularity_counts_are_not_built_for_candidates_whose_outputs_are_gathered(world: World, monkeypatch) -> None:
    """`transform` builds the raw popularity columns only where the ops that read them run: not when it gathers their
    outputs from the item tables (`gathered_tables`), which it does unless an id lies beyond the counted ones or no
    slot is filled; the features are the same either way."""
    pipe = world.pipelines["gbdt"]
    features = copy.deepcopy(pipe.features)
    sessions = pipe.encode(check_request(world.sessions[:30], K))
    cands = pipe.candidates(sessions)
    assert sorted(features.gathered_tables(cands)) == sorted(features.item_tables())
    beyond = Candidates(cands.items.masked_fill(cands.items == cands.items[0, 0], len(features.popularity)), cands.features)
    assert features.gathered_tables(beyond) == {} and features.gathered_tables(Candidates(cands.items * 0)) == {}
    built, raw = [], features.raw

    def recording(*args):
        columns = raw(*args)
        built.append(sorted(columns))
        return columns

    monkeypatch.setattr(features, "raw", recording)
    gathered = features.transform(sessions, cands, pipe.stage_retrievers)
    features._tables = (features.ops, features.popularity, {})  # the ops run on the candidates' rows
    computed = features.transform(sessions, cands, pipe.stage_retrievers)
    assert "popularity" not in built[0] and "seen_count" in built[0] and "popularity" in built[1]
    assert gathered.names == computed.names and torch.equal(gathered.dense, computed.dense)
    assert gathered.dense[..., gathered.names.index("popularity_log")].std() > 0


def test_what_the_features_keep_between_requests_follows_their_names(world: World) -> None:
    """The time features' names and the dense columns' order are found once and kept for the next request: the same
    features as a fresh copy's, and other names give other time features."""
    pipe = world.pipelines["gbdt"]
    features = copy.deepcopy(pipe.features)
    for lo in (0, 30):
        sessions = pipe.encode(check_request(world.sessions[lo : lo + 30], K))
        cands = pipe.candidates(sessions)
        fresh = copy.deepcopy(pipe.features).transform(sessions, cands, pipe.stage_retrievers)
        kept = features.transform(sessions, cands, pipe.stage_retrievers)
        assert kept.names == fresh.names and torch.equal(kept.dense, fresh.dense)
    names = features.names
    assert features.time_names == [n for n in names if n == "session_duration" or n.startswith(("time_hour_", "time_weekday_"))]
    features.names = ["session_duration", "seen_count", "time_hour_sin"]
    assert features.time_names == ["session_duration", "time_hour_sin"]
    features.names = None
    assert features.time_names == []


# ------------------------------------------------------------------------- rules in the pipeline
def test_the_seen_filter_follows_the_session_models_exclusion_unless_set(world: World, tmp_path: Path) -> None:
    """A recipe without seen_filter filters what its session models' evaluation excludes (exclude_seen: the last
    max_length events, as the leave-one-out fragments evaluate), nothing when they exclude nothing; a value given wins."""
    from sessrec.tasks import Evaluation

    torch.manual_seed(0)
    excluding = NextItemTask(num_items=world.dm.num_items, max_length=MAX_LENGTH, encoder=XLNetEncoder(**XLNET),
                             evaluation=Evaluation(exclude_seen=True))
    excluding.vocab = world.dm.vocab
    excluding_dir = excluding.recommender().save_pretrained(tmp_path / "excluding")

    def seen(*dirs: Path, **pipeline) -> SeenItemsFilter | None:
        recipe = small_recipe(world, tmp_path, models={f"m{i}": ModelRetrieval(str(d), k=30) for i, d in enumerate(dirs)},
                              **pipeline)
        recipe.retrievers(None, index_sessions(world.dm))
        return recipe.seen_items_filter()

    assert seen(world.model_dir) is None
    assert seen(excluding_dir).window == MAX_LENGTH
    assert seen(excluding_dir, seen_filter="none") is None
    assert seen(excluding_dir, seen_filter="session").window is None
    assert seen(world.model_dir, seen_filter="window", seen_window=3).window == 3
    assert small_recipe(world, tmp_path, seen_filter="window", seen_window=3).build().history_length == 200
    assert small_recipe(world, tmp_path, seen_filter="window", seen_window=300).build().history_length == 300  # kept
    with pytest.raises(ValueError, match=r"^seen_filter: the session models exclude different items of a session \(m0 none, "
                                         rf"m1 its last {MAX_LENGTH}\): set seen_filter"):
        seen(world.model_dir, excluding_dir)


@pytest.mark.parametrize(("pipeline", "width"), [({}, MAX_LENGTH), ({"seen_filter": "window", "seen_window": 3}, MAX_LENGTH),
                                                 ({"seen_filter": "session"}, 200),
                                                 ({"seen_filter": "window", "seen_window": 300}, 300)])
def test_the_ranker_trains_on_prefixes_as_wide_as_its_seen_filter_reads(world: World, tmp_path: Path, monkeypatch,
                                                                        pipeline: dict, width: int) -> None:
    """A seen-items filter that reads past max_length removes at serving candidates that prefixes max_length wide
    kept as training rows: the ranker's pairs are then as wide as the pipeline's history."""
    import sessrec.pipeline_training.recipe as recipe_module

    given = []
    monkeypatch.setattr(recipe_module, "fit_ranker", lambda pipe, pairs, *a, **k: given.append(pairs) or pytest.skip())
    with pytest.raises(pytest.skip.Exception):
        small_recipe(world, tmp_path, **pipeline).fit()
    expected = world.dm.pairs("valid", width=width)  # as wide as the window, or the longest prefix if narrower
    assert torch.equal(given[0].items, expected.items) and torch.equal(given[0].targets, expected.targets)
    assert (given[0].items.shape[1] > MAX_LENGTH) == (width > MAX_LENGTH)


def test_seen_filter_and_diversity_cap_through_the_pipeline(world: World, tmp_path: Path) -> None:
    raw = world.dm.vocab.raw_ids.to_pylist()
    categories = tmp_path / "categories.parquet"
    pq.write_table(pa.table({"item_id": raw, "category": [i % 4 for i in raw]}), categories)
    sessions = world.sessions

    def lists(**stages) -> list[list[int]]:
        pipe = Pipeline(world.dm.vocab, world.retrievers, max_length=MAX_LENGTH, max_candidates=50, **stages)
        return [r["item_ids"] for r in pipe.recommend(sessions, k=K)]

    plain = lists()
    assert any(set(items) & set(s) for items, s in zip(plain, sessions))  # repeats are candidates...
    assert any(len(s) > MAX_LENGTH for s in sessions)
    for items, session in zip(lists(filters=[SeenItemsFilter()]), sessions):
        # ...until filtered: the whole session (its history), not only the max_length events the models see
        assert len(items) == K and not set(items) & set(session)
    for items, session in zip(lists(filters=[SeenItemsFilter(window=2)]), sessions):
        assert not set(items) & set(session[-2:])
    assert any(len({i % 4 for i in items}) < len(items) for items in plain)
    for items in lists(ordering=Ordering(diversity=DiversityCap(str(categories), max_per_category=1))):
        assert sorted(i % 4 for i in items) == [0, 1, 2, 3]  # one item of each of the 4 categories


@pytest.mark.parametrize("name", ["gbdt", "dlrm"])
def test_evaluate_rows_equals_evaluate(world: World, name: str) -> None:
    """Ranking prepared test rows gives exactly the metrics of the end-to-end evaluation."""
    pipe = world.pipelines[name]
    pairs = world.dm.pairs("test")
    direct = fitting.evaluate_pipeline(pipe, pairs, (5, 10), batch_size=64)
    prepared = fitting.evaluate_rows(pipe, fitting.candidate_rows(pipe, pairs, 64), (5, 10), batch_size=48)
    assert prepared.keys() == direct.keys()
    for key, value in direct.items():
        assert prepared[key] == pytest.approx(value, abs=1e-9), key
    assert 0 < direct["recall@10"] <= direct["candidate_recall"] <= 1
    with pytest.raises(ValueError, match=r"^ks must be positive integer cut-offs, got \[\]$"):
        fitting.evaluate_pipeline(pipe, pairs, ())
    with pytest.raises(ValueError, match="^evaluate_pipeline: no .prefix, target. pairs to evaluate$"):
        fitting.evaluate_pipeline(pipe, pairs.take(slice(0, 0)))
    with pytest.raises(ValueError, match=r"^ks must be positive integer cut-offs, got \[0\]$"):
        fitting.retrieval_recall(pipe, pairs.items, pairs.targets, [0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gbdt", "dlrm"])
def test_metrics_do_not_depend_on_the_order_or_the_batching_of_the_test_pairs(world: World, name: str) -> None:
    """Shuffled test pairs and other batch sizes give the same metrics, end to end and on prepared rows
    (up to the order in which the per-batch sums are added)."""
    pipe = world.pipelines[name]
    pairs = world.dm.pairs("test")
    shuffled = pairs.take(torch.randperm(len(pairs), generator=torch.Generator().manual_seed(0)))
    assert not torch.equal(shuffled.targets, pairs.targets)
    base = fitting.evaluate_pipeline(pipe, pairs, (5, 10), batch_size=64)
    runs = {
        "shuffled": fitting.evaluate_pipeline(pipe, shuffled, (5, 10), batch_size=64),
        "batch 7": fitting.evaluate_pipeline(pipe, pairs, (5, 10), batch_size=7),
        "batch all": fitting.evaluate_pipeline(pipe, shuffled, (5, 10), batch_size=len(pairs)),
        "rows shuffled": fitting.evaluate_rows(pipe, fitting.candidate_rows(pipe, shuffled, 33), (5, 10), batch_size=11),
        "rows batch all": fitting.evaluate_rows(pipe, fitting.candidate_rows(pipe, pairs, 13), (5, 10), batch_size=len(pairs)),
    }
    for run, metrics in runs.items():
        assert metrics.keys() == base.keys(), run
        for key, value in base.items():
            assert metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (run, key)
    assert 0 < base["mrr@10"] < base["recall@10"]


@pytest.mark.parametrize("name", ["gbdt", "dlrm"])
def test_one_session_per_request_gives_the_lists_of_one_batch(world: World, name: str) -> None:
    """`recommend` of each session alone (batch 1) and of all of them at once (the batch paths of the kNN,
    co-visitation, merge and rankers) give the same lists and scores."""
    pipe = world.pipelines[name]
    sessions = world.sessions[:40]
    together = pipe.recommend(sessions, k=K)
    alone = [pipe.recommend([session], k=K)[0] for session in sessions]
    assert [r["item_ids"] for r in alone] == [r["item_ids"] for r in together]
    assert all(len(r["item_ids"]) == K for r in together)
    for one, all_ in zip(alone, together):
        assert one["scores"] == pytest.approx(all_["scores"], rel=1e-5, abs=1e-6)


def test_a_cascade_gives_one_session_the_lists_of_one_batch(world: World) -> None:
    """The two fitted rankers blended as a cascade (the trees on the DLRM's 12 best of 50 candidates): each session
    alone and all of them at once get the same lists; the shortlist changes lists against the whole blend."""
    members = [world.pipelines["dlrm"].scorer, world.pipelines["gbdt"].scorer]
    cascade, whole = copy.copy(world.pipelines["dlrm"]), copy.copy(world.pipelines["dlrm"])
    cascade.scorer, whole.scorer = BlendScorer(members, shortlist=12), BlendScorer(members)
    sessions = world.sessions[:40]
    together = cascade.recommend(sessions, k=K)
    alone = [cascade.recommend([session], k=K)[0] for session in sessions]
    assert [r["item_ids"] for r in alone] == [r["item_ids"] for r in together]
    for one, all_ in zip(alone, together):
        assert one["scores"] == pytest.approx(all_["scores"], rel=1e-5, abs=1e-6)
    blended = whole.recommend(sessions, k=K)
    assert sum(a["item_ids"] != b["item_ids"] for a, b in zip(together, blended)) > 0


def test_recommend_casts_id_strings_and_refuses_mixed_ids(world: World) -> None:
    pipe = world.pipelines["gbdt"]
    session = world.sessions[0]
    assert pipe.recommend([[str(i) for i in session]], k=K) == pipe.recommend([session], k=K)
    with pytest.raises(TypeError, match=r"item ids of the request mix types: session 1, position 1 holds 'not-an-id' "
                                        rf"\(str\) where the first id {session[0]} is int; give every id"):
        pipe.recommend([[session[0]], [session[1], "not-an-id"]], k=K)
    with pytest.raises(TypeError, match="cannot be read as the vocabulary's int64 ids"):
        pipe.recommend([["not-an-id"]], k=K)


# ------------------------------------------------------------------------- estimators per recipe
def test_recipes_own_their_estimators(world: World, tmp_path: Path) -> None:
    """Two recipes built in one process (from the defaults, or from one passed object) share no
    estimator, and fitting one leaves the other unfitted."""
    import inspect

    defaults = inspect.signature(PipelineRecipe).parameters
    first = PipelineRecipe(world.dm, covisitation=CoVisitation(), covisitation_k=30, max_candidates=50,
                           scorer=GBDTScorer(**GBDT_ARGS), output=str(tmp_path / "first"))
    second = PipelineRecipe(world.dm, covisitation=CoVisitation(), covisitation_k=30, max_candidates=50)
    for name in ("features", "scorer", "ordering"):
        assert getattr(first, name) is not getattr(second, name), name
        assert getattr(second, name) is not defaults[name].default, name
    assert config_of(second.features) == config_of(defaults["features"].default)  # a copy of the default
    first.fit()
    assert first.features.ops is not None and first.scorer.booster is not None
    unfitted = [s.network is None if isinstance(s, DLRMScorer) else s.booster is None for s in second.scorer.scorers]
    assert second.features.ops is None and second.features.popularity is None and all(unfitted)
    assert defaults["features"].default.ops is None and defaults["scorer"].default.scorers[0].network is None

    shared = GBDTScorer(**GBDT_ARGS)  # one object given to two recipes: each fits its own copy
    third, fourth = (PipelineRecipe(world.dm, covisitation=CoVisitation(), covisitation_k=30, max_candidates=50,
                                    scorer=shared, output=str(tmp_path / name)) for name in ("third", "fourth"))
    third.fit()
    assert third.scorer.booster is not None and fourth.scorer.booster is None and shared.booster is None


def test_recipe_files_leave_estimators_to_the_defaults_and_still_show_them(world: World, tmp_path: Path) -> None:
    from sessrec.cli.parsers import load_recipe, recipe_parser

    recipe, _ = write_recipe(world, tmp_path)  # sets the scorer, leaves features and ordering to the defaults
    a, b = load_recipe(recipe), load_recipe(recipe)
    assert a.features is not b.features and a.ordering is not b.ordering and a.scorer is not b.scorer
    parser = recipe_parser()
    shown = yaml.safe_load(parser.dump(parser.parse_args(["--config", str(recipe)])))["pipeline"]
    assert shown["features"]["class_path"] == "sessrec.pipeline.CandidateFeatures"
    assert shown["ordering"]["class_path"] == "sessrec.pipeline.Ordering"
    assert load_recipe(recipe, ["--pipeline.device", "cpu"]).build().device == torch.device("cpu")


# ---------------------------------------------------------------------------------------- device
def test_pipeline_runs_on_an_explicit_device(world: World, saved: dict[str, Path]) -> None:
    cpu = torch.device("cpu")
    assert world.pipelines["gbdt"].device == cpu  # the session model's device (loaded on the CPU)
    pipe = Pipeline.from_pretrained(saved["dlrm"], device=cpu)
    assert pipe.device == cpu and pipe.stage_retrievers["xlnet"].device == cpu
    assert all(p.device == cpu for p in pipe.scorer.network.parameters())
    pairs = world.dm.pairs("test")
    sessions = RequestSessions(pairs.items[:40])
    cands = pipe.candidates(sessions)
    scored = pipe.score(sessions, cands)
    recs = pipe.recommend_batch(sessions, k=K)
    for tensor in (cands.items, *cands.features.values(), scored.scores, recs.items, recs.scores):
        assert tensor.device == cpu
    assert recs.items.tolist() == world.pipelines["dlrm"].recommend_batch(sessions, k=K).items.tolist()
    assert fitting.evaluate_pipeline(pipe, pairs) == fitting.evaluate_pipeline(world.pipelines["dlrm"], pairs)


def rule_pipeline(world: World, tmp_path: Path) -> Pipeline:
    """The world's GBDT ranker behind every kind of filter and ordering rule, the sampler included."""
    raw = world.dm.vocab.raw_ids.to_pylist()
    categories, windows = tmp_path / "categories.parquet", tmp_path / "windows.parquet"
    pq.write_table(pa.table({"item_id": raw, "category": [i % 4 for i in raw]}), categories)
    pq.write_table(pa.table({"item_id": raw[::3], "valid_from": [0.0] * len(raw[::3]),
                             "valid_to": [2e9 if i % 2 else 1.5e9 for i in range(len(raw[::3]))]}), windows)
    fitted = world.pipelines["gbdt"]
    ordering = Ordering(boosts=[BoostRule(raw[::5], 0.5)], diversity=DiversityCap(str(categories), 2),
                        sampling=SoftmaxSampling(1.0, seed=3))
    return Pipeline(world.dm.vocab, world.retrievers, max_length=MAX_LENGTH, max_candidates=50,
                    filters=[SeenItemsFilter(window=3), ItemTableFilter(str(windows), mode="deny")],
                    features=fitted.features, scorer=fitted.scorer, ordering=ordering)


@pytest.mark.parametrize("name", ["gbdt", "dlrm", "rules"])
def test_every_stage_builds_its_tensors_on_the_sessions_device(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """With the default device set to ``meta``, a tensor built without a device holds no data and
    cannot meet a CPU tensor: a pipeline on the CPU gives the same results as with the default CPU
    only if every stage builds on the device of its sessions (the session model's encoder is left
    to the models' own GPU tests: its Hugging Face layers build on the default device, then move)."""
    pipe = rule_pipeline(world, tmp_path) if name == "rules" else world.pipelines[name]
    objective = world.retrievers["xlnet"][0].objective
    encode = objective.next_item_hidden

    def on_cpu(*args, **kwargs):
        with torch.device("cpu"):
            return encode(*args, **kwargs)

    monkeypatch.setattr(objective, "next_item_hidden", on_cpu)
    pairs = world.dm.pairs("test")
    items, targets = pairs.items, pairs.targets
    now = torch.linspace(4e8, 6e8, 80, dtype=torch.float64)  # half the deny windows close before the end

    def run() -> tuple:
        if pipe.ordering.sampling is not None:
            pipe.ordering.sampling = SoftmaxSampling(1.0, seed=3)  # the same samples on each run
        recs = pipe.recommend_batch(RequestSessions(items[:80], now=now.clone()), k=K)
        rows = fitting.candidate_rows(pipe, pairs, 64)
        return (recs.items, recs.scores, fitting.evaluate_pipeline(pipe, pairs, batch_size=64),
                fitting.evaluate_rows(pipe, rows, batch_size=48), fitting.retrieval_recall(pipe, items, targets, (10, 50)))

    expected = run()
    with torch.device("meta"):
        got = run()
    assert got[0].device == torch.device("cpu")
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert got[2:] == expected[2:]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gbdt", "dlrm"])
def test_pipeline_on_cuda_matches_the_cpu(world: World, name: str) -> None:
    """Fitted and run on CUDA (session model, exact index and DLRM there), the pipeline agrees with the CPU run."""
    from sessrec.pipeline.retrieval.index import ExactIndex

    valid, test = world.dm.pairs("valid"), world.dm.pairs("test")
    out, pipes = {}, {}
    for device in ("cpu", "cuda"):
        model = SessionModelRetriever.from_pretrained(world.model_dir, ExactIndex())
        retrievers = {**world.retrievers, "xlnet": (model, 30)}  # kNN and co-visitation stay on the host
        features = CandidateFeatures().fit_statistics(index_sessions(world.dm), world.dm.num_items)
        pipe = pipes[device] = Pipeline(world.dm.vocab, retrievers, max_length=MAX_LENGTH, max_candidates=50,
                                        features=features, device=device)
        scorer = GBDTScorer(**GBDT_ARGS) if name == "gbdt" else DLRMScorer(max_epochs=2)
        fitting.fit_ranker(pipe, valid, scorer)
        recs = pipe.recommend_batch(fitting.sessions_of(test.take(slice(0, 80))), k=K)  # with their event times
        assert recs.items.device.type == device and model.built_index()._vectors.device.type == device
        if name == "dlrm":
            assert next(pipe.scorer.network.parameters()).device.type == device
        out[device] = (recs, fitting.evaluate_pipeline(pipe, test))
    (cpu, cpu_metrics), (_, gpu_metrics) = out["cpu"], out["cuda"]
    # each device's ranker is fitted on its own rows: the session model's scores differ in the last
    # bits on the GPU, which reorders near-tied ranks, so the rows and the fitted rankers differ a
    # little (on an H100, LightGBM: NDCG@10 0.6786 against the CPU's 0.6535 on these 168 test pairs)
    for key, value in cpu_metrics.items():
        assert gpu_metrics[key] == pytest.approx(value, abs=0.04), key
    if name == "gbdt":
        # the CPU's ranker (LightGBM runs on the host) served by the CUDA pipeline: the CPU's figures
        # (on an H100: NDCG@10 0.65369 against 0.65354)
        pipes["cuda"].scorer = pipes["cpu"].scorer
        served = pipes["cuda"].recommend_batch(fitting.sessions_of(test.take(slice(0, 80))), k=K)
        for key, value in fitting.evaluate_pipeline(pipes["cuda"], test).items():
            assert value == pytest.approx(cpu_metrics[key], abs=0.005), key
        # near-tied candidates may swap places, shifting the ranks after them (on an H100: 0.93 of the
        # 800 served positions hold the CPU's item, 0.99 of each session's top 10 is the CPU's)
        same_place = (served.items.cpu() == cpu.items).float().mean().item()
        shared = (served.items.cpu()[:, :, None] == cpu.items[:, None, :]).any(-1).float().mean().item()
        assert same_place > 0.85 and shared > 0.95, (same_place, shared)
