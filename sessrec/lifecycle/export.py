"""Export of trained models to ONNX and TorchScript, each with a JSON description of its tensors.

`export_session_model` writes a `SessionRecommender`'s scorer, `export_dlrm` a `ClickRanker`'s
(the artifacts of `sessrec.artifacts`); both write ``model.onnx`` (or ``model.pt``), the model's
vocabulary ``vocab.parquet`` (raw ids <-> the model ids the file reads and returns) and ``model.json``
(inputs and outputs: names, dtypes, shapes with symbolic axes; the ONNX opset; the vocabulary's
fingerprint and rows; for a session model that reads side features, how raw values become its inputs,
with their categories in ``side_features.parquet`` (`side_rules`); the version exported, for a versioned
model directory) into a directory, so the folder is all a server needs, whatever is promoted later. By default they check the written
file against eager PyTorch on a batch of another shape than the export example, so a file whose
batch or length axis came out fixed is refused at export time rather than found in serving.

Exporters (as they behave with torch 2.13, onnxscript 0.7 and onnxruntime 1.32):
- ONNX: ``torch.onnx.export(dynamo=True)`` (torch.export + onnxscript), the default and the
  recommended exporter. It gives symbolic batch and length axes from ``dynamic_shapes`` and
  exports every encoder but GRU4Rec. The TorchScript-based exporter (``dynamo=False``,
  deprecated) fails on SASRec (no translation of the in-place ``aten::__ior_``) and GRU4Rec.
- TorchScript: ``torch.jit.trace``. ``torch.jit.script`` compiles neither BERT nor SASRec; a trace
  keeps shapes symbolic here because no encoder branches on them in Python, and the export-time
  check on a batch of another shape guards that. torch 2.13 marks ``torch.jit`` deprecated (a
  DeprecationWarning on trace, save and load); it is still the one format that carries GRU4Rec.

Refused (a `ValueError` naming the encoder, the format and why): GRU4Rec to ONNX. Its GRU runs
on a ``PackedSequence`` whose state is sized by the data (``batch_sizes[0]``), which torch.export
cannot trace, and its stable ``argsort`` has no ONNX translation in either exporter. It exports
to TorchScript.

Shape letters: B batch, L session length, V items (incl. padding and OOV), K top-k,
Dd dense features, H ids per sample of one sparse feature.

`export_model_dir` does the same for a model directory (``runs/<name>/model``, read without Lightning):
the current version of a versioned one, whose name ``model.json`` records.

Examples:
    >>> from sessrec.artifacts import SessionRecommender
    >>> recommender = SessionRecommender.from_pretrained("runs/xlnet/model")  # doctest: +SKIP
    >>> path = export_session_model(recommender, "exported/xlnet", "onnx", top_k=20)  # doctest: +SKIP
    >>> path.name  # doctest: +SKIP
    'model.onnx'
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

from sessrec.artifacts import ClickRanker, SessionRecommender, load_artifact
from sessrec.artifacts.click_ranker import check_parts
from sessrec.artifacts.model_directory import VOCAB
from sessrec.data.vocab import NUM_SPECIAL, OOV, PAD
from sessrec.datasets.clickouts import DENSE_FEATURES
from sessrec.embeddings import SparseFeatures
from sessrec.embeddings.sparse_arch import DynamicSparseArch
from sessrec.models.objective import EVENT_TIMES, latest
from sessrec.models.onnx_graph import (
    ONNX_LIMITS,
    example_items,
    example_times,
    first_line,
    max_abs_diff,
    opset_of,
    to_onnx,
)
from sessrec.models.session_model import next_item_scores, top_recommendable
from sessrec.saved import versions
from sessrec.saved.atomic import (
    atomic_path,
    fsync_dir,
    normal_modes,
    remove_abandoned,
    stage_name,
    write_text,
)
from sessrec.saved.directory import vocabulary_record
from sessrec.scoring.output import check_folder

Format = Literal["onnx", "torchscript"]
FILES = {"onnx": "model.onnx", "torchscript": "model.pt"}
SIDE_FEATURES = "side_features.parquet"  # the categories of a side-feature model's categorical features (maybe none)
TOLERANCE = 1e-4  # max abs difference of finite scores between the exported file and eager PyTorch

# (encoder class, format) -> why it cannot export with torch 2.13 (see the module docstring)
KNOWN_LIMITS: dict[tuple[type[nn.Module], str], str] = {
    (cls, "onnx"): f"{why}; export it with format='torchscript'" for cls, why in ONNX_LIMITS.items()
}


@dataclass
class TensorSpec:
    """One input or output of an exported model: name, NumPy dtype name, shape (ints and axis names)."""

    name: str
    dtype: str
    shape: list[int | str]


@dataclass
class ExportSpec:
    """What ``model.json`` says about an exported model: its file and tensors, the vocabulary written beside it
    (``{"file": "vocab.parquet", "fingerprint": "sha256:...", "rows": N}``), for a session model that reads side
    features how raw values become its inputs (`side_rules`; None: it reads none, or a DLRM) and the version of
    the model directory exported (None: a directory without versions, or an artifact exported from memory)."""

    format: str
    file: str
    opset: int | None
    model: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    notes: dict[str, object]
    vocab: dict[str, object]
    side_features: dict[str, object] | None
    version: str | None


# -- the exported modules ------------------------------------------------------------------------
class NextItemScorer(nn.Module):
    """A trained `SessionModel` as one function: items (B, L) [, side features, event times (B, L) each] -> scores.

    Sessions are right-aligned model ids (0 = padding), cut to their latest ``inference.max_length``
    items and read the way the model was trained to read them, as `SessionRecommender.scores` reads
    them: ``model(items, objective, features)``, then `exclude_seen` when its inference settings
    ask for it. Outputs: ``scores`` (B, V), -inf for padding, OOV, virtual (and excluded) items;
    with `top_k`, also ``top_scores`` (B, K) and ``top_items`` (B, K) model ids, best first (`top_recommendable`,
    as served: a session with fewer than K recommendable items, its own excluded, gets id 0 past the last, scored -inf).

    Side features are extra inputs, one (B, L) tensor per feature after ``items``, in
    `feature_names` order: int64 ids for categorical features, float32 for continuous ones.
    Item vectors are tables inside the model and need no input. A model whose encoder reads event
    times (`HSTUEncoder`: ``uses_times``) takes them as the last input, ``event_times``: (B, L) float64
    seconds aligned with the items (padding's are not read), as served models read a request's.

    Args:
        recommender: the trained model (its network shared, not copied) with its objective and
            inference settings.
        top_k: also return the K best items (clipped to the recommendable ones); None: scores only.
        exclude_seen: never score an item of the input session (default: the inference settings').
    """

    def __init__(self, recommender: SessionRecommender, top_k: int | None = None, exclude_seen: bool | None = None) -> None:
        super().__init__()
        if not isinstance(recommender, SessionRecommender):
            raise TypeError(f"NextItemScorer exports a SessionRecommender, got {type(recommender).__name__}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        model = recommender.model
        self.model = model
        # a plain attribute, not a submodule: RTD's generator is training-only and stays out of the file
        object.__setattr__(self, "objective", recommender.objective)
        self.exclude_seen = recommender.inference.exclude_seen if exclude_seen is None else exclude_seen
        self.max_length = recommender.inference.max_length  # items read, as served (at most the network's)
        self.recommendable = int(self.model.recommendable.sum())
        self.top_k = None if top_k is None else min(top_k, self.recommendable)
        side = self.model.side_info
        self.categorical = list(side.categorical) if side is not None else []
        self.continuous = list(side.continuous) if side is not None else []
        self.times = model.uses_times

    @property
    def feature_names(self) -> list[str]:
        """The inputs after ``items``: side features, then ``event_times`` for a model that reads them."""
        return [*self.categorical, *self.continuous, *([EVENT_TIMES] if self.times else [])]

    def forward(self, items: torch.Tensor, *features: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if len(features) != len(self.feature_names):
            raise ValueError(f"expected the inputs items, {', '.join(self.feature_names)}; got {1 + len(features)} tensors")
        side = dict(zip(self.feature_names, features)) if self.feature_names else None
        items, side = latest(items, side, self.max_length)
        scores = next_item_scores(self.model, self.objective, items, side, self.exclude_seen)  # (B, V)
        if self.top_k is None:
            return scores
        items, values = top_recommendable(scores, self.top_k, self.recommendable)  # (B, K)
        return scores, values, items

    def inputs(self) -> list[TensorSpec]:
        return [
            TensorSpec("items", "int64", ["batch", "length"]),
            *(TensorSpec(n, "int64", ["batch", "length"]) for n in self.categorical),
            *(TensorSpec(n, "float32", ["batch", "length"]) for n in self.continuous),
            *([TensorSpec(EVENT_TIMES, "float64", ["batch", "length"])] if self.times else []),
        ]

    def outputs(self) -> list[TensorSpec]:
        scores = TensorSpec("scores", "float32", ["batch", self.model.num_items])
        if self.top_k is None:
            return [scores]
        return [scores, TensorSpec("top_scores", "float32", ["batch", self.top_k]),
                TensorSpec("top_items", "int64", ["batch", self.top_k])]

    def example(self, batch: int, length: int, seed: int, unusual: bool = False) -> tuple[torch.Tensor, ...]:
        """Right-aligned sessions (B, L) of random items with left padding (and their side features); `unusual`: the
        last session fills all L columns and its item before the last is unknown (OOV), as requests may bring them."""
        g = torch.Generator().manual_seed(seed)
        model, device = self.model, self.model.item_embedding.weight.device
        items = example_items(model.recommendable, batch, length, g)  # (B, L)
        if unusual:
            items[-1] = example_items(model.recommendable, length, length, g)[-1]  # L items
            items[-1, -2] = OOV
        side = model.side_info
        cats = [torch.randint(1, side.categorical[n].num_embeddings, (batch, length), generator=g) for n in self.categorical]
        conts = [torch.randn(batch, length, generator=g) for _ in self.continuous]
        times = [example_times(batch, length, g)] if self.times else []
        return tuple(t.to(device) for t in (items, *cats, *conts, *times))

    def describe(self) -> dict[str, object]:
        return {
            "encoder": type(self.model.encoder).__name__,
            "objective": type(self.objective).__name__,
            "exclude_seen": self.exclude_seen,
            "num_items": self.model.num_items,
            "max_length": self.max_length,  # items read; the [MASK] slot is added inside
            "items": "right-aligned model ids, 0 = padding; longer sessions keep their latest items",
            "scores": "-inf for padding, OOV, virtual and excluded items",
            **({"top_items": "best first; 0 (padding, scored -inf) past the last item a session can be recommended"}
               if self.top_k is not None else {}),
            **({EVENT_TIMES: "event times in seconds (float64), aligned with items; padding's are not read"}
               if self.times else {}),
        }


class ExportedClickScorer(nn.Module):
    """A trained click ranker's `DLRM` as one function: dense (B, Dd) and ids (B, H) per sparse feature -> logits (B,).

    The inputs are those of a click-out row (`sessrec.datasets.clickouts`): ``dense`` holds `DENSE_FEATURES`
    in that order, and each sparse feature's ids are the ranker's vocabulary's (`describe`: ``ids_from_vocab``).
    The ids of each sparse feature come as a padded matrix, -1 (any negative) marking an absent id (the
    convention of `SparseFeatures.from_dense`); H may differ between features and calls (a
    one-hot feature is (B, 1)). An id at or past the number of ids the vocabulary gives the feature is the
    unseen id 1, as ``sessrec test`` reads a value the vocabulary lacks. The tables are pooled here by a
    gather and a masked sum (or mean)
    instead of the model's `SparseArch`: its jagged `SparseFeatures` path reads the ids' counts on
    the host to check and chunk them, which neither exporter can trace (torch.export stops on a
    data-dependent size; torch.jit.trace on the fused optimizer's autograd anchor), while a padded
    id matrix is what a server receives anyway. The dense MLP, interaction and top MLP are the
    model's own.

    Args:
        ranker: the trained model (its network shared, not copied) and its vocabulary.

    Raises:
        ValueError: the DLRM and the vocabulary do not belong together (`check_parts`).
    """

    def __init__(self, ranker: ClickRanker) -> None:
        super().__init__()
        if not isinstance(ranker, ClickRanker):
            raise TypeError(f"ExportedClickScorer exports a ClickRanker, got {type(ranker).__name__}")
        self.model = ranker.model
        arch = self.model.sparse_arch
        check_parts(self.model, ranker.vocab)
        self.feature_names = list(arch.feature_names)
        self.sizes = [ranker.vocab.cardinalities[f] for f in self.feature_names]  # ids of each feature
        self.tables = [arch.table_of[f] for f in self.feature_names]
        self.mean = [arch.pooling[t] == "mean" for t in self.tables]
        # every table as rows by id (the fused weight's views, or a growing table's rows laid out by id),
        # detached: tables that are parameters (FusedTables with optimizer none, HybridTables) are constants of the exported file
        self.weights = {name: arch.table_weight(name).detach() for name in dict.fromkeys(self.tables)}
        # a growing table's ids it met, by id: one it never met is absent, adding nothing to a bag nor counting for a mean
        self.met = {name: _met(arch.tables[name], self.weights[name].shape[0]) for name in self.weights} \
            if isinstance(arch, DynamicSparseArch) else {}

    def pooled(self, ids: torch.Tensor, table: str, mean: bool, size: int) -> torch.Tensor:
        """(B, H) ids, negative = absent, `size` ids in the vocabulary -> (B, D) pooled rows of `table`; an empty
        bag gives zeros. An id a growing table never met is absent too (as the table reads it in eval)."""
        weight = self.weights[table]  # (N, D)
        known = torch.where(ids < size, ids, torch.full_like(ids, OOV))  # past the vocabulary: an unseen value
        rows = known.clamp(min=0, max=weight.shape[0] - 1)  # absent ids read row 0 (masked out)
        present = ids >= 0  # (B, H)
        if table in self.met:  # never met (the last row: every id past the largest met): absent
            present = present & self.met[table][rows]
        summed = (weight[rows] * present.unsqueeze(-1)).sum(dim=1)  # (B, D)
        return summed / present.sum(dim=1, keepdim=True).clamp(min=1) if mean else summed

    def forward(self, dense: torch.Tensor, *ids: torch.Tensor) -> torch.Tensor:
        model = self.model
        x = model.dense_arch(dense)  # (B, D)
        e = torch.stack([self.pooled(i, t, m, n) for i, t, m, n in zip(ids, self.tables, self.mean, self.sizes)], dim=1)
        return model.over_arch(model.interaction(x, e.to(x.dtype)))  # (B,)

    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("dense", "float32", ["batch", self.model.num_dense]),
                *(TensorSpec(n, "int64", ["batch", _axis("ids", n)]) for n in self.feature_names)]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("logits", "float32", ["batch"])]

    def example(self, batch: int, hot: int, seed: int) -> tuple[torch.Tensor, ...]:
        """Random dense features (B, Dd) and ids (B, `hot`) per feature within its vocabulary, some of them absent (-1);
        for a growing table, the first bag holds an id it met and one it never met (when it has both), so that a check
        on this batch sees how they pool together."""
        g = torch.Generator().manual_seed(seed)
        device = self.model.over_arch.mlp[0].weight.device
        ids = []
        for size, table in zip(self.sizes, self.tables):
            x = torch.randint(0, size, (batch, hot), generator=g)
            x = x.masked_fill(torch.rand(batch, hot, generator=g) < 0.3, -1)
            if table in self.met and hot >= 2:
                met = self.met[table][:size].cpu()
                known, unknown = met.nonzero().squeeze(1), (~met).nonzero().squeeze(1)
                if known.numel() and unknown.numel():
                    x[0, :2] = torch.stack([known[0], unknown[0]])
            ids.append(x)
        return tuple(t.to(device) for t in (torch.randn(batch, self.model.num_dense, generator=g), *ids))

    def eager(self, dense: torch.Tensor, *ids: torch.Tensor) -> torch.Tensor:
        """The model's own forward on the same inputs (through `SparseFeatures`): the reference."""
        return self.model(dense, SparseFeatures.from_dense(dict(zip(self.feature_names, ids))))

    def describe(self) -> dict[str, object]:
        return {
            "interaction": type(self.model.interaction).__name__,
            "dense_features": list(DENSE_FEATURES),  # the columns of `dense`, in order (docs/deploy.md says how)
            "ids": "one (B, H) int64 matrix per sparse feature, -1 = absent; H may vary",
            "ids_from_vocab": {  # a raw value -> its id: the i-th row (0-based) of its feature in the file is id i + first
                "file": VOCAB, "feature_column": "feature", "raw_column": "raw_id", "first": NUM_SPECIAL,
                "unseen": OOV, "padding": PAD, "absent": -1,
                "sizes": dict(zip(self.feature_names, self.sizes)),  # ids per feature; an id past them reads as unseen
            },
            "logits": "click logits (apply a sigmoid for probabilities)",
        }


# -- public functions ----------------------------------------------------------------------------
def export_session_model(
    recommender: SessionRecommender,
    out_dir: str | os.PathLike,
    format: Format = "onnx",
    top_k: int | None = None,
    opset: int | None = None,
    verify: bool = True,
    version: str | None = None,
) -> Path:
    """Write a session model's next-item scorer (`NextItemScorer`), its vocabulary and ``model.json`` into `out_dir`.

    Args:
        recommender: a trained session model (`SessionRecommender.from_pretrained`), read the way its
            objective and inference settings say. Its network is exported in eval mode and left in
            the mode it was in.
        out_dir: directory for ``model.onnx`` / ``model.pt``, ``vocab.parquet``, ``model.json`` and, for a model
            that reads side features, ``side_features.parquet`` (created).
        format: ``onnx`` or ``torchscript``.
        top_k: also output the K best items and their scores.
        opset: ONNX opset; None = the exporter's default (recorded in ``model.json``).
        verify: run the written file on a batch of another size and length than the export
            example, with a session longer than ``max_length`` and an unknown item, and raise
            RuntimeError unless its scores (and top items) match eager PyTorch to `TOLERANCE`
            (needs onnxruntime for ONNX).
        version: the version of the model directory `recommender` was read from, recorded in ``model.json``.

    Returns:
        The path of the model file.

    Raises:
        ValueError: the format is unknown, the encoder cannot be exported to it (the message
            says why, e.g. GRU4Rec to ONNX), or the model reads side features without their fitted
            transforms (`side_rules`).
    """
    scorer = NextItemScorer(recommender, top_k)  # refuses anything but a SessionRecommender
    side = side_rules(scorer, recommender)
    model = recommender.model
    encoder = model.encoder
    reason = next((why for (cls, fmt), why in KNOWN_LIMITS.items() if isinstance(encoder, cls) and fmt == format), None)
    if reason is not None:
        raise ValueError(f"{type(encoder).__name__} cannot be exported to {format}: {reason}")
    length = max(2, min(scorer.max_length, 6))  # >= 2: torch.export fixes axes of size 1
    example = scorer.example(3, length, seed=0)
    # checked on what the example lacks: another batch size, a session longer than the model reads (cut as served), an unknown item
    probe = scorer.example(5, scorer.max_length + 3, seed=1, unusual=True)
    return _export(scorer, scorer.forward, example, probe, out_dir, format, opset, verify, type(encoder).__name__,
                   recommender.vocab, version, side)


def export_dlrm(
    ranker: ClickRanker,
    out_dir: str | os.PathLike,
    format: Format = "onnx",
    opset: int | None = None,
    verify: bool = True,
    version: str | None = None,
) -> Path:
    """Write a DLRM's scorer (`ExportedClickScorer`: dense and padded sparse ids -> logits), its vocabulary and ``model.json``.

    Args:
        ranker: a trained click model (`ClickRanker.from_pretrained`); its network is exported in
            eval mode and left in the mode it was in.
        out_dir: directory for ``model.onnx`` / ``model.pt``, ``vocab.parquet`` and ``model.json`` (created).
        format: ``onnx`` or ``torchscript``.
        opset: ONNX opset; None = the exporter's default.
        verify: check the written file against the model's own forward (through `SparseFeatures`)
            on a batch of another size and hotness than the export example.
        version: the version of the model directory `ranker` was read from, recorded in ``model.json``.

    Returns:
        The path of the model file.
    """
    if not isinstance(ranker, ClickRanker):
        raise TypeError(f"export_dlrm exports a ClickRanker, got {type(ranker).__name__}")
    scorer = ExportedClickScorer(ranker)
    example, probe = scorer.example(3, 2, seed=0), scorer.example(7, 4, seed=1)
    return _export(scorer, scorer.eager, example, probe, out_dir, format, opset, verify, "DLRM", ranker.vocab, version)


def export_model_dir(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    format: Format = "onnx",
    top_k: int | None = None,
    verify: bool = True,
) -> Path:
    """Export the model of a model directory (``runs/<name>/model``): a session model or a DLRM.

    Args:
        model_dir: the model directory (`read_model_dir` reads it: the current version of a versioned one).
        out_dir: directory for the model file, ``vocab.parquet`` and ``model.json``.
        format: ``onnx`` or ``torchscript``.
        top_k: for a session model, also output the K best items.
        verify: check the written file against eager PyTorch (see `export_session_model`).

    Returns:
        The path of the model file.

    Raises:
        ValueError: `out_dir` is `model_dir` or inside it (before the model is read).
        PermissionError: `out_dir` is a file or cannot be written (before the model is read).
    """
    check_folder(out_dir, "--out", [model_dir])
    artifact, version = read_model_dir(model_dir)
    if isinstance(artifact, ClickRanker):
        return export_dlrm(artifact, out_dir, format, verify=verify, version=version)
    return export_session_model(artifact, out_dir, format, top_k=top_k, verify=verify, version=version)


def read_model_dir(model_dir: str | os.PathLike) -> tuple[SessionRecommender | ClickRanker, str | None]:
    """The artifact of a model directory and the name of the version it was read from (None for a directory
    without versions): the pointer is read once, so a promotion meanwhile cannot pair one version's name
    with another's model."""
    folder = versions.resolve(model_dir)
    return load_artifact(folder), versions.version_of(folder)


def side_rules(scorer: NextItemScorer, recommender: SessionRecommender) -> tuple[pa.Table, dict[str, object]] | None:
    """What an export carries of the side features its graph reads (None: it reads none): the categories of each
    categorical feature (``side_features.parquet``) and the ``side_features`` section of ``model.json``, each input's
    rule from raw values (`SideFeatureTransform.rules`), so that a server holding the folder alone builds the inputs
    ``sessrec predict`` builds.

    Raises:
        ValueError: the model reads side features but `recommender` holds no fitted transforms of them.
    """
    names = [*scorer.categorical, *scorer.continuous]
    if not names:
        return None
    if recommender.side_transform is None:
        raise ValueError(f"the model reads the side features {names} but holds no fitted transforms of their raw values "
                         "(a model directory's features.npz): the export could not say how to build its inputs; export "
                         "the model directory sessrec fit wrote")
    table, rules = recommender.side_transform.rules()
    return table, {
        "file": SIDE_FEATURES,
        "sessions": "a session's events in time order (stable); every feature is computed over the whole session, then "
                    "items and features alike are cut to its latest max_length events (the graph cuts a longer one "
                    "itself); padding's values are not read",
        "inputs": {name: rules[name] for name in names},  # in the order of the graph's inputs
    }


# -- helpers -------------------------------------------------------------------------------------
def _met(table: nn.Module, rows: int) -> torch.Tensor:
    """(rows,) whether a growing table (`DynamicEmbeddingBag`) met each id, by id: the layout of `table_weight`."""
    met = torch.zeros(rows, dtype=torch.bool, device=table.sorted_keys.device)
    met[table.sorted_keys] = True
    return met


def _axis(prefix: str, name: str) -> str:
    """A symbolic axis name that is a Python identifier (torch.export's ``Dim`` needs one)."""
    return f"{prefix}_{re.sub(r'[^0-9a-zA-Z_]', '_', name)}"


@contextlib.contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    """Eval mode and no autograd inside; every submodule back in its own mode after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


STAGE = ".export-"  # an export's hidden folder in `out_dir`: .export-<host>-<pid>-<random> (`stage_name`)


def _export(
    scorer: NextItemScorer | ExportedClickScorer,
    reference: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    example: tuple[torch.Tensor, ...],
    probe: tuple[torch.Tensor, ...],
    out_dir: str | os.PathLike,
    format: str,
    opset: int | None,
    verify: bool,
    what: str,
    vocab: object,
    version: str | None,
    side: tuple[pa.Table, dict[str, object]] | None = None,
) -> Path:
    """Export `scorer` traced on `example`, check it on `probe` against `reference`, write `vocab` (and the side
    features' categories, `side_rules`) beside it and ``model.json`` (recording the vocabulary, the side features'
    rules and `version`). The files are written and checked in a hidden folder inside `out_dir` and moved into place
    only then, ``model.json`` last: an export that fails (an exporter's error, a file that differs from eager
    PyTorch) leaves `out_dir` as it was, an earlier export in it whole."""
    if format not in FILES:
        raise ValueError(f"format must be one of {tuple(FILES)}, got {format!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_abandoned(out, STAGE)
    stage = Path(tempfile.mkdtemp(prefix=f"{stage_name(STAGE)}-", dir=out))
    try:
        path = stage / FILES[format]
        inputs, outputs = scorer.inputs(), scorer.outputs()
        with _eval_mode(scorer):
            try:
                if format == "onnx":
                    written_opset = _to_onnx(scorer, example, inputs, outputs, path, opset)
                else:
                    written_opset = _to_torchscript(scorer, example, inputs, path)
            except ModuleNotFoundError:
                raise  # an extra that is not installed (onnx, onnxscript): the command line names the extra
            except Exception as err:  # the exporters raise many types; one clear line, with the cause chained
                raise ValueError(f"{what} cannot be exported to {format}: {first_line(err)}") from err
            if verify:
                _verify(path, format, probe, reference(*probe), what)
        vocab.save(stage / VOCAB)
        if side is not None:
            pq.write_table(side[0], stage / SIDE_FEATURES)
        spec = ExportSpec(format, path.name, written_opset, type(scorer.model).__name__, inputs, outputs,
                          scorer.describe(), {"file": VOCAB, **vocabulary_record(vocab)},
                          None if side is None else side[1], version)
        write_text(path.with_suffix(".json"), json.dumps(asdict(spec), indent=2) + "\n")
        normal_modes(stage)
        written = [path.name, VOCAB, *([SIDE_FEATURES] if side is not None else []), path.with_suffix(".json").name]
        for name in written:  # model.json last
            os.replace(stage / name, out / name)
        for other in {*FILES.values(), SIDE_FEATURES} - set(written):  # what an export of another run wrote: replaced too
            (out / other).unlink(missing_ok=True)
        fsync_dir(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out / path.name

def _to_onnx(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    path: Path,
    opset: int | None,
) -> int:
    """`to_onnx`, the named axes of `inputs` dynamic, written to `path`; returns the opset written."""
    dims: dict[str, torch.export.Dim] = {}  # one Dim per axis name: inputs that share a name share the axis
    per_input = tuple(
        {i: dims.setdefault(a, torch.export.Dim(a)) for i, a in enumerate(t.shape) if isinstance(a, str)} for t in inputs
    )
    # forward(first, *rest): torch.export sees (first, rest) once rest is not empty
    shapes = (per_input[0], per_input[1:]) if len(per_input) > 1 else per_input
    proto = to_onnx(module, example, [t.name for t in inputs], [t.name for t in outputs], shapes, opset)
    with atomic_path(path) as tmp:
        tmp.write_bytes(proto.SerializeToString())
    return opset_of(proto)


def _dtype_checked(x: torch.Tensor, dtype: torch.dtype, name: str, expected: str) -> torch.Tensor:
    """`x`, or an error naming the input when it is not of `dtype` (scripted: the check stays in a traced file)."""
    if x.dtype != dtype:
        raise ValueError("input " + name + " must be " + expected + " (model.json lists the inputs and their dtypes)")
    return x


class _DtypeChecked(nn.Module):
    """`module` behind a check of each input's dtype against `inputs`: a trace reads any dtype it is given, and
    float32 epoch seconds (multiples of 128 s) or int32 ids would give other scores without an error."""

    def __init__(self, module: nn.Module, inputs: list[TensorSpec]) -> None:
        super().__init__()
        self.module, self.inputs = module, inputs
        self.check = torch.jit.script(_dtype_checked)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self.module(*(self.check(t, getattr(torch, s.dtype), s.name, s.dtype) for t, s in zip(tensors, self.inputs)))


def _to_torchscript(module: nn.Module, example: tuple[torch.Tensor, ...], inputs: list[TensorSpec], path: Path) -> None:
    """torch.jit.trace; shapes stay symbolic (checked by `_verify` on another shape), an input of another dtype
    than `inputs` say is refused."""
    with warnings.catch_warnings():
        # a TracerWarning says a Python value became a constant of the trace: `_verify` runs the file on
        # another shape, which is the check that warning asks for
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(_DtypeChecked(module, inputs), example, check_trace=False)
    with atomic_path(path) as tmp:
        torch.jit.save(traced, str(tmp))


def run_exported(path: str | os.PathLike, *inputs: torch.Tensor) -> list[np.ndarray]:
    """Run an exported file (by its suffix: onnxruntime for ``.onnx``, torch.jit for ``.pt``) on CPU."""
    path = Path(path)
    arrays = [t.detach().cpu() for t in inputs]
    if path.suffix == ".onnx":
        import onnxruntime as ort  # optional: the deploy extra

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, {n: a.numpy() for n, a in zip(names, arrays)})
    module = torch.jit.load(str(path), map_location="cpu")
    with torch.no_grad():
        out = module(*arrays)
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def _verify(
    path: Path, format: str, probe: tuple[torch.Tensor, ...], expected: torch.Tensor | tuple[torch.Tensor, ...], what: str
) -> None:
    """Raise RuntimeError (and remove the file) unless the file run on `probe` gives `expected` to `TOLERANCE`: its first
    output; with a session scorer's ``top_scores`` and ``top_items``, those too, the items as the eager scores rank them
    (an item whose eager score ties with the expected one's within `TOLERANCE` may take its place)."""
    expected = [t.detach().cpu().numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]
    actual = run_exported(path, *probe)
    diff = max_abs_diff(actual[0], expected[0])
    if len(expected) == 3:  # scores, top_scores, top_items
        ranked = np.take_along_axis(expected[0], actual[2], axis=1)  # the eager scores of the file's top items
        diff = max(diff, max_abs_diff(actual[1], expected[1]), max_abs_diff(ranked, expected[1]))
    if not diff <= TOLERANCE:
        path.unlink(missing_ok=True)
        raise RuntimeError(
            f"the exported {what} ({format}) differs from eager PyTorch by {diff:.3g} (> {TOLERANCE}) on a batch "
            f"of shape {tuple(probe[0].shape)}, other than the export example's: an axis may have been fixed"
        )
