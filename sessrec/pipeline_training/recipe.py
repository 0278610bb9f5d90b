"""`PipelineRecipe`: a pipeline recipe's typed configuration, and its ``fit`` / ``test`` / ``recommend``.

A pipeline recipe has one top-level block, ``pipeline:``, whose keys are the constructor
arguments below (checked by jsonargparse before anything runs):

    sessrec fit       --config recipes/pipeline_rsc15.yaml    # fits kNN/co-visitation and the ranker, saves
    sessrec test      --config recipes/pipeline_rsc15.yaml    # loads the saved pipeline, test-split metrics
    sessrec recommend --config recipes/pipeline_rsc15.yaml --input_path sessions.parquet --output recs.parquet

Each trained session model is named by its model directory (``models.<name>.model_dir:
runs/<x>/model``, which ``sessrec fit`` writes). The sessions are those the stage-1 models were
trained on: the data module that the first model directory's ``data`` section describes (``sessrec
fit`` records it there; built by the registry), and every other model directory's must describe the
same sessions (the settings that only shape training batches aside, `BATCH_ONLY`). A data block
(``pipeline.data``, a `SessionDataModule`) given in the recipe wins over them: the pipeline then
reads other data with the same vocabulary. The vocabulary is the first model's (read from its model
directory, unless a data block names a ``vocab_path``), and every other model's must equal it, so
that every stage shares one vocabulary. Training sessions fit the kNN and co-visitation retrievers,
the validation pairs fit the ranker, the test pairs are scored by ``test`` only.

A fit-time module: `sessrec.pipeline` imports it on first use of `PipelineRecipe` (it loads the
Lightning data module). A recipe file is read by the command line's parser of it
(`sessrec.cli.parsers.recipe_parser`, `load_recipe`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from sessrec.artifacts.model_directory import CONFIG, VOCAB, read_model_directory
from sessrec.artifacts.session_recommender import SessionRecommender
from sessrec.baselines import SessionBaseline
from sessrec.data import frame
from sessrec.data.pairs import EvalPairs
from sessrec.metrics.aggregate import cutoffs
from sessrec.pipeline.candidate_features import CandidateFeatures
from sessrec.pipeline.filters import ItemTableFilter, SeenItemsFilter
from sessrec.pipeline.ordering import Ordering
from sessrec.pipeline.pipeline import HISTORY_LENGTH, Pipeline
from sessrec.pipeline.retrieval.baseline_retriever import BaselineRetriever
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.pipeline.retrieval.index import ExactIndex, FaissIndex
from sessrec.pipeline.retrieval.retriever import Retriever
from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever
from sessrec.pipeline.scoring import BlendScorer, DLRMScorer, GBDTScorer
from sessrec.pipeline_training.fitting import evaluate_pipeline, fit_ranker
from sessrec.pipeline_training.progress import Stages
from sessrec.saved import versions
from sessrec.saved.registry import check_integers, instantiate
from sessrec.tasks.session_data import SessionDataModule

# settings of a data module that only shape training batches (the training loader's): the pipeline reads
# the splits' sessions and evaluation pairs, so two model directories that differ in them share their sessions
BATCH_ONLY = frozenset({"batch_size", "eval_batch_size", "train_prefixes", "augment_reversed",
                        "shuffle_chunk", "bucket_batches", "streaming", "shuffle_buffer", "pin_memory", "seed"})
NO_DATA = ("a pipeline recipe reads its sessions from pipeline.data or from its models' model directories: give "
           "pipeline.data (the stage-1 recipe's data block) or models.<name>.model_dir, a model directory written by sessrec fit")


@dataclass
class ModelRetrieval:
    """A trained session model as a retriever.

    Args:
        model_dir: its model directory (``runs/<name>/model``, which ``sessrec fit`` writes).
        k: candidates it contributes.
        index: ``exact`` (blocked product), ``hnsw`` or ``ivf`` (FAISS).
        runtime: where its query runs: ``torch`` or ``onnxruntime`` (its ONNX graph on the CPU, saved with
            the pipeline; `SessionModelRetriever`).
        seed: the stage-1 seed the model was trained with (``sessrec fit --seed_everything``);
            None: its recipe's own. Two models of one recipe with seeds 0 and 1 are a two-seed
            ensemble; ``benchmarks/pipeline_eval.py`` reads it to find the models of other seeds.
    """

    model_dir: str
    k: int = 100
    index: Literal["exact", "hnsw", "ivf"] = "exact"
    runtime: Literal["torch", "onnxruntime"] = "torch"
    seed: int | None = None


@dataclass
class BaselineRetrieval:
    """A kNN (or popularity) baseline as a retriever, fitted on the training sessions.

    Args:
        baseline: e.g. ``{class_path: sessrec.baselines.VSKNN, init_args: {k: 100}}``.
        k: candidates it contributes.
    """

    baseline: SessionBaseline
    k: int = 100


class PipelineRecipe:
    """Everything a pipeline is built from.

    Args:
        data: other sessions than the stage-1 models' (a data block with their vocabulary); None: the data
            module that the first model directory's ``data`` section describes (``sessrec fit`` writes it).
        models: name -> trained session model.
        baselines: name -> kNN baseline; a name of `models` (or ``covisitation`` with `covisitation`) is refused: the
            pipeline keeps its retrievers by name.
        covisitation: co-visitation retriever settings; None for none.
        covisitation_k: candidates it contributes (None: 100); given without `covisitation`, it is refused (it
            would be ignored).
        max_candidates: merged candidates kept per session.
        seen_filter: drop items of the session (``none``: keep them, repeats are common targets;
            ``window``: the last `seen_window` events; ``session``: all of it, up to the pipeline's ``history_length``
            events). None: as the session models evaluate, ``none`` unless they exclude the session's items
            (``exclude_seen``, the leave-one-out fragments), then ``window`` over the events that exclusion reads (their
            ``max_length``); session models that disagree are refused, asking for a value.
        seen_window: events of the ``window`` filter, >= 1 (None: 1), all of them kept (the pipeline's
            ``history_length`` is raised to it); given with another `seen_filter`, it is refused (it would be ignored).
        item_tables: allow/deny tables (`ItemTableFilter`).
        features: the ranking features.
        scorer: the ranker: `BlendScorer` (default: a `DLRMScorer` and two `GBDTScorer`s), or one ranker alone.
        ordering: business rules of the final list. The recipe keeps its own copies of
            `features`, `scorer` and `ordering` (it fits them in place), never the objects given.
        device: where the pipeline runs (``cpu``, ``cuda``, ``cuda:1``); None: the device of the
            first session model's weights (CPU as loaded from a model directory).
        ranker_pairs: the validation pairs the ranker trains on: ``protocol`` (the evaluation
            protocol's, e.g. each session's last item) or ``all_prefixes`` (every prefix of every
            validation session with its next item: more rows, still only validation sessions).
        ranker_negatives: the candidates other than the target that the ranker trains on per pair,
            drawn at random (None: all of them); the feature ops are fitted on all candidates.
        output: directory of the saved pipeline.
        ks: cut-offs of the printed metrics.
        batch_size: sessions per batch when building candidates.
    """

    def __init__(
        self,
        data: SessionDataModule | None = None,
        models: dict[str, ModelRetrieval] | None = None,
        baselines: dict[str, BaselineRetrieval] | None = None,
        covisitation: CoVisitation | None = None,
        covisitation_k: int | None = None,
        max_candidates: int = 200,
        seen_filter: Literal["none", "window", "session"] | None = None,
        seen_window: int | None = None,
        item_tables: list[ItemTableFilter] | None = None,
        features: CandidateFeatures = CandidateFeatures(),  # noqa: B008 - a config value, copied per recipe
        scorer: DLRMScorer | GBDTScorer | BlendScorer = BlendScorer(),  # noqa: B008 - a config value, copied per recipe
        ordering: Ordering = Ordering(),  # noqa: B008 - a config value, copied per recipe
        ranker_pairs: Literal["protocol", "all_prefixes"] = "protocol",
        ranker_negatives: int | None = None,
        refit_retrievers: bool = False,
        output: str = "runs/pipeline/pipeline",
        ks: list[int] = [10, 20],  # noqa: B006 - read only
        batch_size: int = 512,
        device: str | None = None,
    ) -> None:
        if not (models or baselines or covisitation):
            raise ValueError("a pipeline recipe needs at least one retriever: models, baselines or covisitation")
        self._data, self.models, self.baselines = data, dict(models or {}), dict(baselines or {})
        if data is None and not self.models:
            raise ValueError(NO_DATA)
        shared = next((name for name in self.baselines if name in self.models), None)
        if shared is not None:
            raise ValueError(f"baselines.{shared}: {shared!r} also names models.{shared}, and a pipeline's retrievers "
                             "are named apart (by name: its features, its file); rename one of them")
        if covisitation is not None and "covisitation" in (*self.models, *self.baselines):
            group = "models" if "covisitation" in self.models else "baselines"
            raise ValueError(f"{group}.covisitation: 'covisitation' names the recipe's co-visitation retriever "
                             f"(covisitation:), and a pipeline's retrievers are named apart; rename {group}.covisitation")
        if covisitation_k is not None and covisitation is None:
            raise ValueError(f"covisitation_k: {covisitation_k} is the candidates of the co-visitation retriever, and the "
                             "recipe has none: add covisitation: {} (its settings), or drop covisitation_k")
        self.covisitation, self.covisitation_k = covisitation, 100 if covisitation_k is None else covisitation_k
        if seen_window is not None and seen_filter != "window":
            raise ValueError(f"seen_window: {seen_window} is the window of seen_filter: window, and seen_filter is "
                             f"{seen_filter}: set seen_filter: window, or drop seen_window")
        if seen_window is not None and (isinstance(seen_window, bool) or seen_window < 1):
            raise ValueError(f"seen_window: {seen_window} is not a number of events (an integer >= 1)")
        check_integers({"max_candidates": max_candidates, "batch_size": batch_size})
        self.max_candidates, self.seen_filter, self.seen_window = max_candidates, seen_filter, seen_window or 1
        self.item_tables = list(item_tables or [])
        self.exclusions: dict[str, int | None] = {}  # session model -> events its exclude_seen reads (None: none)
        for name, spec in self.models.items():
            if not str(spec.model_dir).strip():
                raise ValueError(f"models.{name}.model_dir is empty: give the model directory that sessrec fit writes "
                                 "(runs/<name>/model)")
            if spec.seed is not None and not 0 <= spec.seed < 2**32:
                raise ValueError(f"models.{name}.seed: {spec.seed} is not a --seed_everything value (0 to 2**32 - 1)")
        # fitted in place: each recipe owns copies, so recipes built from the same defaults (or the
        # same objects) never share a fitted estimator
        self.features, self.scorer, self.ordering = copy.deepcopy((features, scorer, ordering))
        self.device = device
        self.output, self.ks, self.batch_size = Path(output), cutoffs(ks), batch_size
        if ranker_negatives is not None and ranker_negatives < 1:
            raise ValueError(f"ranker_negatives must be >= 1 candidates per pair (or null: all of them), got {ranker_negatives}")
        self.ranker_pairs, self.ranker_negatives, self.refit_retrievers = ranker_pairs, ranker_negatives, refit_retrievers
        for rule in (*self.item_tables, *self.ordering.rules):
            rule.read()  # a bad table is refused now, before anything is fitted

    @property
    def data(self) -> SessionDataModule:
        """The pipeline's sessions: the recipe's data block, else the stage-1 models' (`stage1_data`, read on first use)."""
        if self._data is None:
            self._data = self.stage1_data()
        return self._data

    def stage1_data(self) -> SessionDataModule:
        """The data module of the first model directory's ``data`` section (built by the registry, which refuses
        any class it does not hold before importing anything), reading that directory's vocabulary.

        Every model directory needs that section, and each must describe the same sessions as the first one
        (`BATCH_ONLY` aside); otherwise one line names the directory (for a difference: both directories and the
        first differing key).
        """
        sections = []
        for name, spec in self.models.items():
            folder, config = read_model_directory(spec.model_dir)  # its current version, format and parts checked
            if config.get("data") is None:
                raise ValueError(f"models.{name}.model_dir: {spec.model_dir} records no data section: {NO_DATA}")
            sections.append((name, spec.model_dir, folder, config["data"]))
        name, first, folder, section = sections[0]
        data = instantiate(section, expected=SessionDataModule, source=str(folder / CONFIG), key="data")
        for other, directory, _, theirs in sections[1:]:
            key = first_difference(section, theirs, "data")
            if key is not None:
                raise ValueError(
                    f"models.{other}.model_dir: {directory} was trained on other sessions than models.{name}.model_dir: "
                    f"{first} ({key} differs); a pipeline's models share their sessions: give pipeline.data to choose them"
                )
        data.vocab_path = str(folder / VOCAB)  # the ids the first model was trained with
        return data

    def ranker_data(self, width: int | None = None) -> EvalPairs:
        """The validation (prefix, next item) pairs that the ranker trains on, with their sessions and times,
        prefixes `width` events wide (None: the data module's ``max_length``; `ranker_width`);
        ``all_prefixes`` that give no more pairs than each session's last item (leave-one-out data: one target
        a user) are refused in one line (the setting would change nothing)."""
        if self.ranker_pairs == "protocol":
            return self.data.scored_pairs("valid", width=width)
        pairs, last = self.data.scored_pairs("valid", "all_prefixes", width), len(self.data.pairs("valid", "last"))
        if len(pairs) <= last:
            raise ValueError(
                f"ranker_pairs: all_prefixes gives the ranker no more validation pairs than each session's last item "
                f"({last}) on {self.data.splits.source} ({type(self.data.source).__name__}): drop ranker_pairs"
            )
        return pairs

    # -- building -------------------------------------------------------------------------------
    def retrievers(self, names: set[str] | None, train: np.ndarray) -> dict[str, tuple[Retriever, int]]:
        """Every retriever (or those in `names`), fitted or loaded; kNN and co-visitation on `train`, the
        training split's `index_sessions`."""
        dm = self.data
        out: dict[str, tuple[Retriever, int]] = {}
        for name, spec in self.models.items():
            if names is not None and name not in names:
                continue
            recommender = SessionRecommender.from_pretrained(spec.model_dir)
            if recommender.vocab != dm.vocab:
                raise ValueError(
                    f"models.{name}.model_dir: {spec.model_dir}: its vocabulary differs from the pipeline's "
                    f"({dm.vocab_path}): every model of a pipeline is trained on the same data and vocabulary"
                )
            index = {"exact": ExactIndex, "hnsw": lambda: FaissIndex("hnsw"), "ivf": lambda: FaissIndex("ivf")}[spec.index]()
            out[name] = (SessionModelRetriever(recommender.model, recommender.objective, index, spec.runtime,
                                                 recommender.inference.max_length), spec.k)
            self.exclusions[name] = recommender.inference.max_length if recommender.inference.exclude_seen else None
        for name, spec in self.baselines.items():
            if names is not None and name not in names:
                continue
            out[name] = (BaselineRetriever(spec.baseline).fit(train, dm.num_items), spec.k)
        if self.covisitation is not None and (names is None or "covisitation" in names):
            out["covisitation"] = (self.covisitation.fit(train, dm.num_items), self.covisitation_k)
        return out

    def refit(self, pipe: Pipeline) -> Pipeline:
        """Fit the kNN and co-visitation retrievers and the popularity statistics of `pipe` again, on
        the training and validation sessions; the session models, the feature ops and the ranker stay as
        fitted. Run after the ranker is fitted (its rows must come from retrievers that never saw the
        validation sessions): the pipeline then serves and is tested with the most recent sessions."""
        dm = self.data
        rows = index_sessions(dm, ("train", "valid"))
        for name, (retriever, _) in pipe.retrievers.items():
            if name in self.baselines or (name == "covisitation" and self.covisitation is not None):
                retriever.fit(rows, dm.num_items).to(pipe.device)
        pipe.features.fit_statistics(rows, dm.num_items)
        return pipe

    def stage1_vocabulary(self) -> None:
        """Read the data with the first session model's vocabulary (its model directory's), unless the data
        block names a vocabulary of its own or the pipeline has no session model (the data module of a
        model directory's data section reads it already)."""
        if self.models and self.data.vocab_path is None:
            first = next(iter(self.models.values()))
            self.data.vocab_path = str(versions.resolve(first.model_dir) / VOCAB)

    def build(self, names: set[str] | None = None) -> Pipeline:
        self.stage1_vocabulary()
        dm = self.data
        train = index_sessions(dm)  # encoded once, for the statistics and the retrievers
        self.features.fit_statistics(train, dm.num_items)
        retrievers = self.retrievers(names, train)
        seen = self.seen_items_filter()
        window = seen.window if seen is not None and seen.window is not None else 0
        return Pipeline(
            dm.vocab, retrievers, max_length=dm.max_length, max_candidates=self.max_candidates,
            history_length=max(HISTORY_LENGTH, window),
            filters=[*([seen] if seen is not None else []), *self.item_tables], features=self.features,
            ordering=self.ordering, device=self.device,
        )

    def seen_items_filter(self) -> SeenItemsFilter | None:
        """The filter of the session's items that `seen_filter` asks for; with None, the one the session models'
        evaluation applies (read by `retrievers`: the events each one's ``exclude_seen`` reads, or None)."""
        if self.seen_filter == "none" or (self.seen_filter is None and not any(self.exclusions.values())):
            return None
        if self.seen_filter is None:
            windows = set(self.exclusions.values())
            if len(windows) > 1:
                shown = ", ".join(f"{name} {'its last ' + str(w) if w else 'none'}" for name, w in self.exclusions.items())
                raise ValueError(f"seen_filter: the session models exclude different items of a session ({shown}): set "
                                 "seen_filter (none, window with seen_window, or session) for the pipeline's lists")
            return SeenItemsFilter(window=windows.pop())
        return SeenItemsFilter(window=self.seen_window if self.seen_filter == "window" else None)

    # -- the subcommands ------------------------------------------------------------------------
    def fit(self) -> Pipeline:
        """Build, fit the ranker on the validation pairs, save to `output`; print each stage as it starts
        and ends, each step of the ranker's fit as it ends (and a line a minute while one runs, `Stages`),
        then what it did."""
        versions.check_writable(self.output)  # before the work, not at its end
        start, stages = time.perf_counter(), Stages("fit", 5 if self.refit_retrievers else 4)
        with stages.stage("reading the data, fitting the retrievers and the feature statistics"):
            self.stage1_vocabulary()
            pairs = self.ranker_data()  # a setting they cannot honour is refused before anything is fitted
            pipe = self.build()
            if (width := ranker_width(pipe)) is not None:
                pairs = self.ranker_data(width)
        with stages.stage(f"fitting the ranker {type(self.scorer).__name__} on the validation pairs"):
            info = fit_ranker(pipe, pairs, self.scorer, self.batch_size, negatives=self.ranker_negatives,
                              log=stages.note)
        with stages.stage("scoring the validation pairs"):
            valid = evaluate_pipeline(pipe, self.data.pairs("valid", width=pipe.history_length), self.ks, self.batch_size)
        if self.refit_retrievers:  # after the validation scores: the refitted retrievers have seen those sessions
            with stages.stage("fitting the kNN and co-visitation retrievers again on the training and validation sessions"):
                self.refit(pipe)
        with stages.stage(f"saving the pipeline to {self.output}"):
            pipe.save_pretrained(self.output)
        shown = " ".join(f"{k}={v:.4f}" for k, v in valid.items())
        print(f"[fit] ranker {type(self.scorer).__name__} on {info['pairs']} validation pairs "
              f"(candidate coverage {info['coverage']:.4f}); saved to {self.output} in {time.perf_counter() - start:.0f} s")
        print(f"[val] (the ranker's own training pairs: optimistic) {shown}")
        return pipe

    def test(self) -> dict[str, float]:
        """Load the saved pipeline and score the test pairs."""
        stages = Stages("test", 2)
        with stages.stage(f"loading {self.output} and reading the data"):
            pipe = Pipeline.from_pretrained(self.output)
            self.stage1_vocabulary()
            if pipe.vocab != self.data.vocab:
                raise ValueError(f"{self.output}: the saved pipeline's vocabulary differs from this recipe's data")
        with stages.stage("scoring the test pairs"):
            metrics = evaluate_pipeline(pipe, self.data.scored_pairs("test", width=pipe.history_length), self.ks, self.batch_size)
        print("[test] " + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        return metrics


def first_difference(a: object, b: object, key: str) -> str | None:
    """The key path of the first value where two data sections differ, `BATCH_ONLY` settings of a data
    module's ``init_args`` aside; None when they describe the same sessions."""
    if isinstance(a, dict) and isinstance(b, dict):
        ignored = BATCH_ONLY if key == "data.init_args" else frozenset()
        for k in [*a, *(k for k in b if k not in a)]:
            if k in ignored:
                continue
            if k not in a or k not in b:
                return f"{key}.{k}"
            found = first_difference(a[k], b[k], f"{key}.{k}")
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return next((f for f in (first_difference(x, y, f"{key}[{i}]") for i, (x, y) in enumerate(zip(a, b))) if f), None)
    return None if a == b else key


def index_sessions(dm: SessionDataModule, splits: tuple[str, ...] = ("train",)) -> np.ndarray:
    """(N, L) whole sessions of `splits` in time order, oldest first (by their last event where the
    data has times, else as listed: the splits in the order given, each in its file's order). A session
    that a later split holds again (leave-one-out: a user's validation sequence is their training one
    an item longer) is kept once, as the later split holds it. The kNN and co-visitation retrievers and
    the popularity statistics are fitted on them."""
    ids = [getattr(dm.splits, split).column(frame.SESSION).to_numpy(zero_copy_only=False) for split in splits]
    later = [np.isin(own, np.concatenate(ids[i + 1 :])) if i + 1 < len(ids) else np.zeros(len(own), bool)
             for i, own in enumerate(ids)]
    rows = np.concatenate([dm.sessions(split).numpy()[~held] for split, held in zip(splits, later)])
    times = [frame.end_times(getattr(dm.splits, split)) for split in splits]
    times = [None if t is None else t[~held] for t, held in zip(times, later)]
    if any(t is None for t in times):
        return rows
    return rows[np.argsort(np.concatenate(times), kind="stable")]


def ranker_width(pipe: Pipeline) -> int | None:
    """The width of the prefixes the ranker of `pipe` trains on: its ``history_length`` where its seen-items
    filter reads past ``max_length`` (the candidates a request's filter removes are no training rows), else
    None (``max_length``: the prefixes the data module holds, no wider copy)."""
    seen = next((f for f in pipe.filters if isinstance(f, SeenItemsFilter)), None)
    if seen is None or (seen.window is not None and seen.window <= pipe.max_length):
        return None
    return pipe.history_length
