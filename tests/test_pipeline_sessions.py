"""Sessions and time through the pipeline's fit and evaluation, on a few hand-written sessions.

Eight catalogue items (raw ids 10..17); validation sessions in which items repeat, so that the
prefixes of one session share items and labels. A popularity retriever returns the whole
catalogue, so every prefix has its target among its candidates. The tests check by hand: the
session and event times of every (prefix, target) pair; that the ranker's target encoding and
early-stopping split go by session (no label crosses from one prefix of a session to another);
that times become ranker features and are required once fitted; that rule windows hold at the
pairs' times; and that metrics rank the target where the ordering served it.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.baselines import VSKNN, Popularity
from sessrec.data import EvalPairs, EventLogSource, Schema, SRGNNSource
from sessrec.data.sources import SessionSource, SessionSplits
from sessrec.pipeline.candidate_features import CandidateFeatures
from sessrec.pipeline.candidates import RequestSessions
from sessrec.pipeline.filters import ItemTableFilter
from sessrec.pipeline.ordering import Ordering, SoftmaxSampling
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.retrieval.baseline_retriever import BaselineRetriever
from sessrec.pipeline.scoring import (
    BlendScorer,
    DLRMScorer,
    GBDTScorer,
    dlrm_scorer,
    early_stopping_split,
    gbdt_scorer,
)
from sessrec.pipeline_training import fitting
from sessrec.tasks import SessionDataModule

torch.set_num_threads(1)
pytest.importorskip("lightgbm")

T0 = 1_704_088_800.0  # 2024-01-01 06:00 UTC, a Monday
TRAIN = [[10 + i % 8, 10 + (i + 1) % 8, 10 + (i + 3) % 8] for i in range(24)]
TRAIN += [[10 + k, 10 + k] for k in range(8) for _ in range(k)]  # item 10 + k: 9 + 2k events, popularity apart
VALID = [[10, 11, 10, 11, 10], [12, 10, 12, 10], [11, 13, 11, 13], [14, 15, 14, 15, 14],
         [13, 12, 13], [15, 16, 15, 16], [16, 17, 16], [17, 14, 17, 14]]
TEST = [[10, 12, 10], [13, 11, 13, 11], [16, 14, 16]]
MAX_LENGTH = 4


def event_time(session: int, event: int, day: int) -> float:
    """Session i starts i hours after 06:00 of `day`; its events are a minute apart."""
    return T0 + day * 86400.0 + session * 3600.0 + event * 60.0


class HandSessions(SessionSource):
    """TRAIN on day 0, VALID on day 1, TEST on day 2, with event times unless `times` is False."""

    def __init__(self, times: bool = True) -> None:
        self.times = times

    def load(self) -> SessionSplits:
        def table(sessions: list[list[int]], day: int, first: int) -> pa.Table:
            cols = {"session_id": list(range(first, first + len(sessions))), "item_id": sessions}
            if self.times:
                cols["timestamp"] = [[event_time(i, j, day) for j in range(len(s))] for i, s in enumerate(sessions)]
            return pa.table(cols)

        return SessionSplits(table(TRAIN, 0, 0), table(VALID, 1, 100), table(TEST, 2, 200), source="hand")


def pipeline(dm: SessionDataModule, max_candidates: int = 8, **stages) -> Pipeline:
    train, _ = dm.tensors("train")
    retriever = BaselineRetriever(Popularity()).fit(train, dm.num_items)
    features = CandidateFeatures().fit_statistics(train, dm.num_items)
    return Pipeline(dm.vocab, {"pop": (retriever, 8)}, max_length=MAX_LENGTH, max_candidates=max_candidates,
                    features=features, **stages)


@pytest.fixture
def dm() -> SessionDataModule:
    return SessionDataModule(source=HandSessions(), max_length=MAX_LENGTH)


# ------------------------------------------------------------------------------- the data side
def test_pairs_carry_their_session_and_event_times(dm: SessionDataModule) -> None:
    pairs = dm.pairs("valid", "all_prefixes")
    lengths = [len(s) - 1 for s in VALID]  # a session of n events gives n - 1 pairs
    assert pairs.sessions.tolist() == [i for i, n in enumerate(lengths) for _ in range(n)]
    # session 0, longest prefix first: [10, 11, 10, 11] -> 10, ..., [10] -> 11
    decode = lambda ids: dm.vocab.decode(ids[ids != 0].numpy()).to_pylist()  # noqa: E731
    assert [decode(row) for row in pairs.items[:4]] == [[10, 11, 10, 11], [10, 11, 10], [10, 11], [10]]
    assert decode(pairs.targets[:4]) == [10, 11, 10, 11]
    t = lambda j: event_time(0, j, day=1)  # noqa: E731
    assert pairs.times.dtype == torch.float64
    assert pairs.times[:4].tolist() == [[t(0), t(1), t(2), t(3)], [0, t(0), t(1), t(2)], [0, 0, t(0), t(1)], [0, 0, 0, t(0)]]
    # the longest prefix of session 3 (5 events) keeps its last MAX_LENGTH events and their times
    row = lengths[0] + lengths[1] + lengths[2]
    assert pairs.sessions[row] == 3 and decode(pairs.items[row]) == [14, 15, 14, 15]
    assert pairs.times[row].tolist() == [event_time(3, j, day=1) for j in range(4)]
    # the protocol's pairs are the tensors' own
    last = dm.pairs("valid")
    assert last.items is dm.tensors("valid")[0] and last.sessions.tolist() == list(range(len(VALID)))
    with pytest.raises(ValueError, match="evaluation splits 'valid' and 'test', got 'train'"):
        dm.pairs("train")


def test_whole_sessions_and_their_time_order(dm: SessionDataModule) -> None:
    from sessrec.pipeline_training.recipe import index_sessions

    encode = lambda raw: dm.vocab.encode(pa.array(raw)).ids.tolist()
    valid = dm.sessions("valid")  # one row per session, its last MAX_LENGTH events, right-aligned
    assert valid.shape == (len(VALID), MAX_LENGTH)
    assert valid[0].tolist() == encode([11, 10, 11, 10]) and valid[4].tolist() == [0, *encode([13, 12, 13])]
    assert torch.equal(dm.sessions("train"), dm.tensors("train")[0])  # no augmentation here: the training rows
    # by the time of their last event (training sessions run into day 2, past the validation day's)
    ends = [(event_time(i, len(s) - 1, 1), valid[i]) for i, s in enumerate(VALID)]
    ends += [(event_time(i, len(s) - 1, 0), dm.sessions("train")[i]) for i, s in enumerate(TRAIN)]
    expected = [row.tolist() for _, row in sorted(ends, key=lambda pair: pair[0])]
    assert index_sessions(dm, ("valid", "train")).tolist() == expected
    train = dm.sessions("train").tolist()
    assert expected[0] == train[0] and expected[-1] == train[-1] and expected != [*valid.tolist(), *train]
    timeless = SessionDataModule(source=HandSessions(times=False), max_length=MAX_LENGTH)
    assert np.array_equal(index_sessions(timeless, ("valid", "train")), np.concatenate([valid, dm.sessions("train")]))
    with pytest.raises(ValueError, match="split must be 'train', 'valid' or 'test', got 'validation'"):
        dm.sessions("validation")


def test_a_baseline_retriever_refuses_times_that_do_not_match_its_sessions() -> None:
    sessions = np.array([[2, 3], [3, 4], [4, 5]])
    ordered = BaselineRetriever(Popularity()).fit(sessions, 6, times=np.array([3.0, 1.0, 2.0]))
    assert ordered.sessions.tolist() == [[3, 4], [4, 5], [2, 3]]
    with pytest.raises(ValueError, match=r"times must hold one value per training session, got shape \(2,\) for 3"):
        BaselineRetriever(Popularity()).fit(sessions, 6, times=np.array([2.0, 1.0]))
    for fit in (BaselineRetriever(Popularity()).fit, VSKNN(k=1, sample_size=1).fit):  # NaN would sort last: the latest
        with pytest.raises(ValueError, match=r"^times: session 0 has time nan, not a finite number$"):
            fit(sessions, 6, times=np.array([np.nan, 1.0, 2.0]))


def test_pairs_times_come_from_an_event_log_and_are_none_without(tmp_path: Path) -> None:
    rows = [(s, item, event_time(s, j, day=0)) for s, session in enumerate(VALID) for j, item in enumerate(session)]
    path = tmp_path / "events.csv"
    pacsv.write_csv(pa.table({"sid": [r[0] for r in rows], "iid": [r[1] for r in rows], "ts": [r[2] for r in rows]}), path)
    source = EventLogSource(str(path), Schema(session_id="sid", item_id="iid", timestamp="ts"), test_fraction=0.25,
                            valid_fraction=0.25)
    dm = SessionDataModule(source=source, max_length=MAX_LENGTH)
    pairs = dm.pairs("test")
    for row, session in zip(pairs.times, pairs.sessions):
        sid = dm.splits.test.column("session_id")[int(session)].as_py()
        events = [r[2] for r in rows if r[0] == sid][:-1][-MAX_LENGTH:]  # the prefix: all but the target
        assert row.tolist() == [0.0] * (MAX_LENGTH - len(events)) + events
    srgnn = tmp_path / "srgnn"
    srgnn.mkdir()
    with open(srgnn / "all_train_seq.txt", "wb") as f:
        pickle.dump([[1, 2, 3], [2, 3, 4], [3, 4, 1]], f, protocol=3)
    with open(srgnn / "test.txt", "wb") as f:
        pickle.dump(([[1, 2], [1]], [3, 2]), f, protocol=3)  # one test session: [1, 2, 3]
    dm = SessionDataModule(source=SRGNNSource(str(srgnn), valid_fraction=0.34), max_length=MAX_LENGTH)
    every = dm.pairs("test", "all_prefixes")
    assert every.times is None and every.sessions.tolist() == [0, 0]


def test_ranker_rows_keep_the_filled_slots_only(dm: SessionDataModule) -> None:
    pipe = pipeline(dm, max_candidates=10)  # 8 items: two empty slots in every row
    pairs = dm.pairs("valid", "all_prefixes")
    data = fitting.candidate_rows(pipe, pairs, batch_size=5)
    assert data.valid.shape == (len(pairs), 10) and int(data.valid.sum()) == len(data.items) == 8 * len(pairs)
    assert data.items.dtype == torch.int32 and data.labels.dtype == torch.bool
    assert all(v.dtype == torch.float32 and v.shape == data.items.shape for v in data.raw.values())
    # a block of rows (across the batches they were built in) is what the pipeline computes for those pairs
    sessions, cands, raw, labels = data.block(7, 12)
    part = pairs.take(slice(7, 12))
    again = pipe.candidates(fitting.sessions_of(part))
    assert torch.equal(cands.items, again.items) and torch.equal(sessions.times, part.times)
    grids = pipe.features.raw(fitting.sessions_of(part), again, pipe.stage_retrievers)
    assert raw.keys() == grids.keys() and "session_duration" in raw
    for name, grid in grids.items():
        assert torch.equal(raw[name], grid[again.valid].float()), name
    assert labels.tolist() == (again.items == part.targets.long().unsqueeze(1))[again.valid].tolist()
    assert data.coverage == 1.0 and len(data) == len(pairs)


# ------------------------------------------------------------------------ session identity in the fit
@pytest.mark.parametrize("name", ["gbdt", "dlrm"])
def test_target_encoding_and_early_stopping_go_by_session(
    dm: SessionDataModule, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    pairs = dm.pairs("valid", "all_prefixes")
    pipe = pipeline(dm)
    data = fitting.candidate_rows(pipe, pairs, batch_size=5)
    assert data.coverage == 1.0
    seen: dict = {}
    module, scorer = (gbdt_scorer, GBDTScorer(max_rounds=3, min_data_in_leaf=1, threads=1, stop_fraction=0.3)) if name == "gbdt" \
        else (dlrm_scorer, DLRMScorer(max_epochs=1, stop_fraction=0.3))
    real_split, real_fit = module.early_stopping_split, type(scorer).fit

    def split(labels, fraction, seed, groups=None):
        seen["split"] = real_split(labels, fraction, seed, groups)
        return seen["split"]

    def fit(self, inputs, labels):
        seen["inputs"], seen["labels"] = inputs, labels
        return real_fit(self, inputs, labels)

    monkeypatch.setattr(module, "early_stopping_split", split)
    monkeypatch.setattr(type(scorer), "fit", fit)
    fitting.fit_on(pipe, data, scorer)
    rows, labels = seen["inputs"], seen["labels"]
    inputs = rows.inputs(torch.arange(len(rows)))  # what the scorer reads, a chunk of pairs at a time
    assert torch.equal(rows.groups, pairs.sessions) and torch.equal(inputs.groups, pairs.sessions)

    # early stopping: every session's rows on one side, some sessions on each
    train, stop = seen["split"]
    sessions = pairs.sessions
    assert set(sessions[train].tolist()).isdisjoint(sessions[stop].tolist()) and len(train) and len(stop)
    assert sorted([*train.tolist(), *stop.tolist()]) == torch.nonzero(labels.sum(dim=1) > 0).squeeze(1).tolist()

    # target encoding by hand: a slot sees the labels of the slots of other folds only, all other sessions
    valid = inputs.valid
    item = inputs.sparse["item"][valid].numpy()
    label = labels[valid].numpy().astype(np.float64)
    session = sessions.unsqueeze(1).expand_as(valid)[valid].numpy()
    op = pipe.features.ops.ops["item_target"]
    fold = op.folds({"session": session})
    assert all(len(set(fold[session == s])) == 1 for s in set(session))  # a session's rows share their fold
    rows = np.repeat(np.arange(len(valid)), valid.sum(dim=1).numpy())
    assert any(len(set(op.folds({"session": rows})[session == s])) > 1 for s in set(session))  # by prefix: they would not
    m = op.smoothing
    expected = []
    for j in range(len(item)):
        out = (fold != fold[j]) & (session != session[j])  # other sessions' rows, in other folds
        assert np.array_equal(out, fold != fold[j])
        prior = label[out].mean()
        same = out & (item == item[j])
        expected.append((label[same].sum() + m * prior) / (same.sum() + m))
    column = inputs.dense[..., inputs.names.index("item_target")][valid]
    assert column.tolist() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("setting", "value"), [("max_candidates", 0), ("max_candidates", -3), ("max_length", 0),
                                                ("max_length", -2)])
def test_sizes_of_no_candidates_or_no_events_are_refused(dm: SessionDataModule, setting: str, value: int) -> None:
    """max_candidates 0 failed at the first request with a reshape error, max_length 0 served the whole session."""
    train, _ = dm.tensors("train")
    retrievers = {"pop": (BaselineRetriever(Popularity()).fit(train, dm.num_items), 8)}
    with pytest.raises(ValueError, match=rf"^{setting} must be an integer >= 1, got {value}$"):
        Pipeline(dm.vocab, retrievers, **{"max_length": MAX_LENGTH, setting: value})


def test_a_seen_window_longer_than_the_history_kept_is_refused(dm: SessionDataModule) -> None:
    """A window of 8 events over a history of 6 filtered the last 6 alone."""
    from sessrec.pipeline.filters import SeenItemsFilter

    train, _ = dm.tensors("train")
    retrievers = {"pop": (BaselineRetriever(Popularity()).fit(train, dm.num_items), 8)}
    with pytest.raises(ValueError, match=r"^SeenItemsFilter window 8 is more than the 6 events the pipeline keeps of a "
                                         r"session \(history_length\): give history_length >= 8$"):
        Pipeline(dm.vocab, retrievers, max_length=MAX_LENGTH, history_length=6, filters=[SeenItemsFilter(window=8)])
    assert Pipeline(dm.vocab, retrievers, max_length=MAX_LENGTH, history_length=8, filters=[SeenItemsFilter(window=8)])


# ------------------------------------------------------------------------ the fit, a chunk of pairs at a time
def small_scorer(name: str):
    if name == "gbdt":
        return GBDTScorer(max_rounds=10, min_data_in_leaf=1, threads=1, stop_fraction=0.3)
    return DLRMScorer(max_epochs=2, batch_sessions=4, stop_fraction=0.3)


def test_chunked_rows_are_the_rows_of_the_whole_grid(dm: SessionDataModule) -> None:
    """The features built 3 pairs at a time (in any order) are those rows of `fit_transform`'s grid,
    out-of-fold target encoding included."""
    pairs = dm.pairs("valid", "all_prefixes")
    pipe = pipeline(dm)
    data = fitting.candidate_rows(pipe, pairs, batch_size=5)
    sessions, cands, raw, labels = data.block(0, len(data))
    whole = pipe.features.fit_transform(sessions, cands, raw, labels, groups=pairs.sessions)
    fitted = pipe.features.fit(sessions, cands, raw, labels, groups=pairs.sessions)
    assert list(fitted) == ["item_target"] and fitted["item_target"].shape == (int(data.valid.sum()),)
    rows = fitting.FeatureMatrix(pipe, data, fitted, chunk=3)
    order = torch.tensor([7, 0, 12, 3, 3, 20, 1])
    got = rows.inputs(order)
    assert rows.names == whole.names and rows.cardinality == whole.cardinality
    assert torch.equal(got.dense, whole.dense[order]) and torch.equal(got.valid, whole.valid[order])
    assert got.sparse.keys() == whole.sparse.keys() and all(torch.equal(got.sparse[n], whole.sparse[n][order]) for n in got.sparse)
    assert torch.equal(got.groups, pairs.sessions[order])
    # in-fold values would differ: the rows' own labels would enter their encoding
    plain = pipe.features.transform(sessions, cands, {}, raw)
    column = whole.names.index("item_target")
    assert not torch.equal(plain.dense[..., column], whole.dense[..., column])


@pytest.mark.parametrize("name", ["gbdt", "dlrm"])
def test_fit_in_small_chunks_scores_as_in_one(dm: SessionDataModule, name: str) -> None:
    pairs, test = dm.pairs("valid", "all_prefixes"), dm.pairs("test", "all_prefixes")
    scores = []
    for chunk in (3, len(pairs), None):  # None: one whole RankingInputs, as the scorers take it from a caller
        pipe = pipeline(dm)
        data = fitting.candidate_rows(pipe, pairs, batch_size=5)
        if chunk is None:
            sessions, cands, raw, labels = data.block(0, len(data))
            inputs = pipe.features.fit_transform(sessions, cands, raw, labels, groups=pairs.sessions)
            grid = torch.zeros(data.valid.shape)
            grid[data.valid] = labels.float()
            pipe.scorer = small_scorer(name).fit(inputs, grid)
        else:
            fitting.fit_on(pipe, data, small_scorer(name), chunk=chunk)
        rows = fitting.candidate_rows(pipe, test, batch_size=5)
        sessions, cands, raw, _ = rows.block(0, len(rows))
        scores.append(pipe.scorer.score(pipe.features.transform(sessions, cands, {}, raw)))
    assert torch.isfinite(scores[0]).any()
    for other in scores[1:]:
        if name == "gbdt":
            assert torch.equal(scores[0], other)
        else:
            assert torch.allclose(scores[0], other, atol=1e-5, rtol=0)


def test_a_blend_fits_every_member_on_features_built_once(dm: SessionDataModule, monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = dm.pairs("valid", "all_prefixes")
    pipe = pipeline(dm)
    data = fitting.candidate_rows(pipe, pairs, batch_size=5)
    asked: list[int] = []
    real = CandidateFeatures.transform

    def counted(self, sessions, candidates, *args, **kwargs):
        asked.append(len(candidates.items))
        return real(self, sessions, candidates, *args, **kwargs)

    monkeypatch.setattr(CandidateFeatures, "transform", counted)
    blend = BlendScorer([small_scorer("dlrm"), small_scorer("gbdt"), small_scorer("gbdt")])  # two epochs of the DLRM
    lines: list[str] = []
    info = fitting.fit_on(pipe, data, blend, chunk=3, log=lines.append)
    assert asked == [3] * (len(pairs) // 3) + [len(pairs) % 3] * (len(pairs) % 3 > 0)  # each pair's features once
    assert info["rows"] == int(data.valid.sum()) and set(info["steps"]) == {"feature_ops", "features", "ranker_0", "ranker_1", "ranker_2"}
    assert [line.split(":")[0] for line in lines] == [
        f"feature ops fitted on {int(data.valid.sum())} rows", f"{len(info['features'])} features of the {info['rows']} rows "
        "the rankers read, built once", "ranker 1/3 DLRMScorer fitted", "ranker 2/3 GBDTScorer fitted", "ranker 3/3 GBDTScorer fitted"]
    assert all(s.network is not None if isinstance(s, DLRMScorer) else s.booster is not None for s in blend.scorers)


def test_sampled_negatives_keep_every_target_and_that_many_others() -> None:
    # pairs of 5, 3 and 4 slots; the second without its target among them, the third with fewer negatives than asked
    labels = torch.tensor([0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0], dtype=torch.bool)
    offsets = torch.tensor([0, 5, 8, 12])
    keep = fitting.sampled_slots(labels, offsets, negatives=3, seed=0)
    assert keep[2] and keep[8] and int(keep[:5].sum()) == 4 and not keep[5:8].any() and int(keep[8:].sum()) == 4
    assert torch.equal(keep, fitting.sampled_slots(labels, offsets, 3, seed=0))  # seeded
    draws = {tuple(torch.nonzero(fitting.sampled_slots(labels, offsets, 1, seed=s)[:5]).squeeze(1).tolist()) for s in range(20)}
    assert all(len(d) == 2 and 2 in d for d in draws) and len(draws) == 4  # each of the 4 negatives drawn by some seed
    assert torch.equal(fitting.sampled_slots(labels, offsets, 10, seed=0), torch.tensor([True] * 5 + [False] * 3 + [True] * 4))


def test_the_rankers_read_the_sampled_rows_with_the_features_of_all(dm: SessionDataModule) -> None:
    pairs = dm.pairs("valid", "all_prefixes")
    pipe = pipeline(dm)
    data = fitting.candidate_rows(pipe, pairs, batch_size=5)
    sessions, cands, raw, labels = data.block(0, len(data))
    whole = pipe.features.fit_transform(sessions, cands, raw, labels, groups=pairs.sessions)
    fitted = pipe.features.fit(sessions, cands, raw, labels, groups=pairs.sessions)
    rows = fitting.FeatureMatrix(pipe, data, fitted, chunk=4, negatives=2, seed=3)
    assert torch.equal(rows.valid.sum(dim=1), torch.full((len(pairs),), 3))  # the target and two others
    assert rows.valid[data.valid.clone().index_put_((data.valid,), labels)].all() and not (rows.valid & ~data.valid).any()
    got = rows.inputs(torch.arange(len(pairs)))
    assert torch.equal(got.dense[rows.valid], whole.dense[rows.valid]) and not got.dense[~rows.valid].any()
    expected = torch.cat([whole.dense[4][rows.valid[4]], whole.dense[1][rows.valid[1]]])  # pairs 4 then 1, 3 slots each
    assert np.array_equal(rows.valid_rows(torch.tensor([4, 1])), expected.numpy())
    assert fitting.fit_on(pipe, data, small_scorer("gbdt"), negatives=2)["rows"] == 3 * len(pairs)


def test_early_stopping_split_by_group_by_hand() -> None:
    labels = torch.tensor([[1, 0], [0, 1], [0, 0], [1, 0], [0, 1], [1, 0], [0, 1]])
    groups = torch.tensor([3, 3, 3, 5, 5, 8, 9])
    train, stop = early_stopping_split(labels, 0.5, seed=1, groups=groups)
    # row 2 has no positive; the four sessions 3, 5, 8, 9: two held out, each with all its rows
    by_side = [{int(g) for g in groups[side]} for side in (train, stop)]
    assert len(by_side[1]) == 2 and by_side[0] | by_side[1] == {3, 5, 8, 9} and not by_side[0] & by_side[1]
    assert sorted([*train.tolist(), *stop.tolist()]) == [0, 1, 3, 4, 5, 6]
    assert [r for r in range(7) if int(groups[r]) in by_side[1] and r != 2] == stop.tolist()
    with pytest.raises(ValueError, match="two or more sessions whose next item is among the candidates; found 1"):
        early_stopping_split(labels, 0.5, seed=1, groups=torch.zeros(7, dtype=torch.long))


# ------------------------------------------------------------------------------------ time features
def test_times_become_ranker_features_and_are_required_once_fitted(dm: SessionDataModule) -> None:
    pipe = pipeline(dm)
    pairs = dm.pairs("valid", "all_prefixes")
    info = fitting.fit_ranker(pipe, pairs, GBDTScorer(max_rounds=3, min_data_in_leaf=1, threads=1))
    cyclic = ["time_hour_cos", "time_hour_sin", "time_weekday_cos", "time_weekday_sin"]
    assert {"session_duration", *cyclic} <= set(info["features"])
    # row 0: session 0's prefix of four events, a minute apart, the last at 06:03 on Tuesday
    sessions = fitting.sessions_of(pairs.take(slice(0, 1)))
    cands = pipe.candidates(sessions)
    inputs = pipe.features.transform(sessions, cands, pipe.stage_retrievers)
    value = dict(zip(inputs.names, inputs.dense[0, 0].tolist()))
    hour, weekday = 6 + 3 / 60, 1
    assert value["session_duration"] == pytest.approx(math.log1p(180.0))
    assert value["time_hour_sin"] == pytest.approx(math.sin(2 * math.pi * hour / 24), abs=1e-6)
    assert value["time_weekday_cos"] == pytest.approx(math.cos(2 * math.pi * weekday / 7), abs=1e-6)
    # the test pairs are scored with their times (`evaluate_pipeline`, as `PipelineRecipe.test`)
    metrics = fitting.evaluate_pipeline(pipe, dm.pairs("test"), ks=(3,))
    assert metrics["candidate_recall"] == 1.0
    # without times the fitted ranker refuses, in one line naming what it needs
    with pytest.raises(ValueError, match=r"fitted with time features \(session_duration, time_hour_cos, .*\): give every session's event times") as err:
        pipe.recommend_batch(RequestSessions(sessions.items))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"fitted with time features \(session_duration, .*\): give every session's event times"):
        pipe.recommend_batch(RequestSessions(sessions.items, now=sessions.now))
    # the features themselves say which need the event times: all of them, never the time of the request
    with pytest.raises(ValueError, match=r"\['session_duration', 'time_hour_cos', .*\] need the event times "
                                         r"\(RequestSessions.times\), which these sessions do not carry") as err:
        pipe.features.transform(RequestSessions(sessions.items), cands, pipe.stage_retrievers)
    assert "\n" not in str(err.value)


def test_a_ranker_fitted_without_times_ignores_them(dm: SessionDataModule) -> None:
    pipe = pipeline(dm)
    untimed = dm.pairs("valid", "all_prefixes")
    untimed = EvalPairs(untimed.items, untimed.targets, untimed.sessions)
    names = fitting.fit_ranker(pipe, untimed, GBDTScorer(max_rounds=3, min_data_in_leaf=1, threads=1))["features"]
    assert not [n for n in names if n.startswith("time_") or n == "session_duration"]
    test = dm.pairs("test")
    without = EvalPairs(test.items, test.targets, test.sessions)
    assert fitting.evaluate_pipeline(pipe, test, ks=(3,)) == fitting.evaluate_pipeline(pipe, without, ks=(3,))


def test_rule_windows_hold_at_the_pairs_times(dm: SessionDataModule, tmp_path: Path) -> None:
    """A deny row for item 13 valid during the validation day's first two hours: removed from the
    candidates of the prefixes that end then, kept for the later ones; without times every row holds."""
    table = tmp_path / "deny.parquet"
    start = event_time(0, 0, day=1)
    pq.write_table(pa.table({"item_id": [13], "valid_from": [start], "valid_to": [start + 2 * 3600.0]}), table)
    pipe = pipeline(dm, filters=[ItemTableFilter(str(table))])
    pairs = dm.pairs("valid", "all_prefixes")
    data = fitting.candidate_rows(pipe, pairs)
    _, cands, _, _ = data.block(0, len(data))
    denied = int(dm.vocab.encode(pa.array([13])).ids[0])
    has = (cands.items == denied).any(dim=1)
    ends = pairs.times[:, -1]
    assert (ends < start + 2 * 3600).any() and (ends >= start + 2 * 3600).any()
    assert has.tolist() == (ends >= start + 2 * 3600).tolist()
    untimed = EvalPairs(pairs.items, pairs.targets, pairs.sessions)
    assert not fitting.candidate_rows(pipe, untimed).block(0, len(pairs))[1].items.eq(denied).any()


class RepeatInTest(HandSessions):
    """HandSessions with one test session, [12, 13, 14, 12]: its last item repeats one 3 events back."""

    def load(self) -> SessionSplits:
        splits = super().load()
        test = pa.table({"session_id": [200], "item_id": [[12, 13, 14, 12]],
                         "timestamp": [[event_time(0, j, day=2) for j in range(4)]]})
        return SessionSplits(splits.train, splits.valid, test, source="hand")


def test_the_evaluation_filters_the_seen_items_the_server_filters_past_max_length() -> None:
    """max_length 2 and a filter of the whole session: the prefix [12, 13, 14] is read by its last two items, and its
    target 12 is filtered as served (the session up to history_length), so the evaluation's metrics are those of the
    served lists."""
    from sessrec.pipeline.filters import SeenItemsFilter

    dm = SessionDataModule(source=RepeatInTest(), max_length=2)
    train, _ = dm.tensors("train")
    pipe = Pipeline(dm.vocab, {"pop": (BaselineRetriever(Popularity()).fit(train, dm.num_items), 8)}, max_length=2,
                    max_candidates=8, filters=[SeenItemsFilter()])
    pairs = dm.pairs("test", "all_prefixes", width=pipe.history_length)
    prefixes = [[12, 13, 14], [12, 13], [12]]  # all_prefixes: the longest first
    decode = lambda ids: dm.vocab.decode(ids[ids != 0].numpy()).to_pylist()  # noqa: E731
    assert [decode(row) for row in pairs.items] == prefixes
    recs = pipe.recommend(prefixes, k=5, now=T0 + 3 * 86400.0)
    assert 12 not in recs[0]["item_ids"]
    served = torch.from_numpy(np.stack([pipe.vocab.encode(pa.array(r["item_ids"])).ids for r in recs]))
    sums = fitting.list_metrics(served, torch.tensor([r["scores"] for r in recs]), pairs.targets.long(), ks=(4,))
    metrics = fitting.evaluate_pipeline(pipe, pairs, ks=(4,))
    assert {n: v for n, v in metrics.items() if n != "candidate_recall"} == pytest.approx(
        {n: v / len(pairs) for n, v in sums.items()})
    assert metrics["recall@4"] == pytest.approx(1 / 3)


def test_the_rows_of_pairs_longer_than_max_length_are_the_sessions_as_served() -> None:
    """Pairs as wide as `history_length` (the evaluation's): their candidate rows hold the features of the sessions as a
    request serves them (the last `max_length` events), so `evaluate_rows` gives `evaluate_pipeline`'s metrics."""
    dm = SessionDataModule(source=RepeatInTest(), max_length=2)
    train, _ = dm.tensors("train")
    pipe = Pipeline(dm.vocab, {"pop": (BaselineRetriever(Popularity()).fit(train, dm.num_items), 8)}, max_length=2,
                    max_candidates=8, features=CandidateFeatures().fit_statistics(train, dm.num_items))
    fitting.fit_ranker(pipe, dm.pairs("valid", "all_prefixes"), small_scorer("gbdt"))
    pairs = dm.pairs("test", "all_prefixes", width=pipe.history_length)
    assert pairs.items.shape[1] == 3  # the prefix [12, 13, 14] is served as [13, 14]
    rows = fitting.candidate_rows(pipe, pairs)
    served = pipe.wrap(pairs.items, pairs.times)
    expected = pipe.features.raw(served, pipe.candidates(served), pipe.stage_retrievers)
    for name, value in rows.raw.items():
        assert torch.equal(value, expected[name][rows.valid]), name
    assert fitting.evaluate_rows(pipe, rows, ks=(2, 4)) == fitting.evaluate_pipeline(pipe, pairs, ks=(2, 4))


# --------------------------------------------------------------------------------- the served order
def test_list_metrics_rank_by_the_served_position() -> None:
    targets = torch.tensor([9, 9, 9])
    recommended = torch.tensor([[4, 9, 7, 8], [4, 7, 9, 8], [4, 7, 8, 9]])
    scores = torch.tensor([[3.0, 1.0, 2.0, 0.5], [3.0, 2.0, 2.0, 0.5], [3.0, 2.0, 2.0, 2.0]])
    # in score order: row 0 is not (9 outscored twice: rank 3), row 1 ties 9 with 7 (ties count against it:
    # rank 3), row 2 is full and 9 ties its last entry (unlisted items may tie too: a miss)
    out = fitting.list_metrics(recommended, scores, targets, ks=[2, 3])
    assert out["recall@2"] == 0.0 and out["recall@3"] == 2.0 and out["mrr@3"] == pytest.approx(2 / 3)
    # served in another order (sampled): the positions 2, 3 and 4, whatever the scores
    out = fitting.list_metrics(recommended, scores, targets, ks=[2, 3], by_score=False)
    assert out["recall@2"] == 1.0 and out["mrr@2"] == pytest.approx(0.5)
    assert out["recall@3"] == 2.0 and out["mrr@3"] == pytest.approx(0.5 + 1 / 3)
    assert out["ndcg@3"] == pytest.approx(1 / math.log2(3) + 1 / math.log2(4))
    assert Ordering().by_score and Ordering(sampling=SoftmaxSampling(0)).by_score
    assert not Ordering(sampling=SoftmaxSampling(1.0)).by_score


def test_evaluation_ranks_what_a_sampling_ordering_served(dm: SessionDataModule) -> None:
    pairs = dm.pairs("valid", "all_prefixes")
    sampled = lambda: Ordering(sampling=SoftmaxSampling(temperature=50.0, seed=3))  # noqa: E731 - a fresh, seeded sampler
    metrics = fitting.evaluate_pipeline(pipeline(dm, ordering=sampled()), pairs, ks=(2, 5), batch_size=6)
    by_hand = pipeline(dm, ordering=sampled())  # the same samples, batch by batch
    served, unsorted = [], 0
    for lo in range(0, len(pairs), 6):
        part = pairs.take(slice(lo, lo + 6))
        sessions = fitting.sessions_of(part)
        cands = by_hand.score(sessions, by_hand.candidates(sessions))
        recs = by_hand.ordering.order(sessions, cands, 6)
        for items, scores, target in zip(recs.items.tolist(), recs.scores.tolist(), part.targets.tolist()):
            served.append(items.index(target) + 1 if target in items else math.inf)
            unsorted += scores != sorted(scores, reverse=True)
    assert unsorted > len(pairs) // 2  # most lists are not in score order
    for k in (2, 5):
        assert metrics[f"recall@{k}"] == pytest.approx(sum(r <= k for r in served) / len(pairs))
        assert metrics[f"mrr@{k}"] == pytest.approx(sum(1 / r for r in served if r <= k) / len(pairs))
