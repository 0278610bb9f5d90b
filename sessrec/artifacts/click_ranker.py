"""`ClickRanker`: a trained `DLRM` with the vocabulary of its sparse features' ids.

The artifact of a trained `DLRMTask` (``sessrec fit`` writes it as ``runs/<name>/model``,
`DLRMTask.ranker` builds it in memory). Its model directory (`sessrec.artifacts.model_directory`)
holds the sections ``model`` (the DLRM, built by the registry), ``vocab`` and, as ``sessrec fit`` and
``sessrec retrain`` write it, ``train_end``: the time of its training click-outs' last event; as ``sessrec fit``
writes it, ``data``: the configuration of the data module it was trained on, which ``sessrec test --model_dir``
holds its settings to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sessrec.artifacts.model_directory import (
    CONFIG,
    NETWORK,
    WEIGHTS,
    load_into,
    load_vocab,
    load_weights,
    read_model_directory,
    read_train_end,
    under,
    with_prefix,
    write_model_directory,
)
from sessrec.datasets.clickout_rows import RankingVocab
from sessrec.datasets.clickouts import DENSE_FEATURES, SPARSE_FEATURES
from sessrec.models.dlrm import DLRM
from sessrec.saved.registry import ConfigError, config_of, instantiate


def check_parts(model: DLRM, vocab: RankingVocab) -> None:
    """Refuse a DLRM that reads other features than a click-out row's (`SPARSE_FEATURES`, `DENSE_FEATURES`),
    or a fixed table of another number of rows than its feature's vocabulary has ids: parts that do not
    belong together. A growing table (`DynamicSparseArch`) takes any id, whatever its rows."""
    arch = model.sparse_arch
    features = list(arch.feature_names)
    if sorted(features) != sorted(SPARSE_FEATURES) or model.num_dense != len(DENSE_FEATURES):
        raise ValueError(
            f"this click ranker's DLRM reads the sparse features {features} and {model.num_dense} "
            f"dense features; its vocabulary and a click-out row give {list(SPARSE_FEATURES)} and "
            f"{len(DENSE_FEATURES)} ({', '.join(DENSE_FEATURES)}): they do not belong together"
        )
    if arch.bounded:
        for feature in features:
            rows, ids = arch.table_rows[arch.table_of[feature]], vocab.cardinalities[feature]
            if rows != ids:
                raise ValueError(f"feature {feature!r}: its table has {rows} rows and the ranker's vocabulary {ids} ids: "
                                 "they do not belong together")


class ClickRanker:
    """A trained click model and the vocabulary of its sparse ids.

    Args:
        model: the trained `DLRM`.
        vocab: one vocabulary per sparse feature, as many ids as each table has rows.
        train_end: time (epoch seconds, UTC) of the last click-out it was trained on; None when unknown.
        data: the ``{"class_path", "init_args"}`` configuration (plain data) of the data module it was trained on, as
            ``sessrec fit`` records it; None when unknown (a ranker built by hand, or by ``sessrec retrain``).

    Raises:
        ValueError: the model and the vocabulary do not belong together (`check_parts`).
    """

    def __init__(self, model: DLRM, vocab: RankingVocab, train_end: float | None = None,
                 data: dict[str, Any] | None = None) -> None:
        if not isinstance(model, DLRM):
            raise TypeError(f"a ClickRanker holds a DLRM, got {type(model).__name__}")
        if not isinstance(vocab, RankingVocab):
            raise TypeError(f"a ClickRanker's vocabulary is a RankingVocab, got {type(vocab).__name__}")
        if data is not None and not isinstance(data, dict):
            raise TypeError(f"a ClickRanker's data configuration is a mapping or None, got {type(data).__name__}")
        check_parts(model, vocab)
        self.model, self.vocab, self.train_end, self.data = model, vocab, train_end, data

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write the model directory (a new version of an existing one); returns the folder written. Refused,
        before anything is written, when the model and the vocabulary do not belong together (`check_parts`)."""
        check_parts(self.model, self.vocab)
        sections = {"model": config_of(self.model)}
        if self.train_end is not None:
            sections["train_end"] = float(self.train_end)
        if self.data is not None:
            sections["data"] = self.data
        return write_model_directory(directory, sections,
                                     with_prefix(self.model.state_dict(), NETWORK), self.vocab)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> ClickRanker:
        """The ranker a model directory holds (its current version), its network in eval mode; refused
        in one line naming the file as `SessionRecommender.from_pretrained` refuses."""
        folder, config = read_model_directory(directory)
        source = str(folder / CONFIG)
        if "objective" in config:
            raise ConfigError(source, "model", "this directory holds a session model: load it with SessionRecommender.from_pretrained")
        model = instantiate(config.get("model"), expected=DLRM, source=source, key="model")
        load_into(model, under(load_weights(folder), NETWORK), str(folder / WEIGHTS))
        vocab = load_vocab(folder, config, RankingVocab.load)
        try:
            check_parts(model, vocab)
        except ValueError as error:
            raise ValueError(f"{folder}: {error}") from None
        data = config.get("data")
        if data is not None and not isinstance(data, dict):
            raise ConfigError(source, "data", f"expected the data module's {{class_path, init_args}}, got {type(data).__name__}")
        return cls(model.eval(), vocab, read_train_end(config, source), data)
