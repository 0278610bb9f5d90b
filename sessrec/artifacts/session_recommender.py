"""`SessionRecommender`: a trained session model with everything that reads raw input into it.

The artifact of a trained `NextItemTask` (``sessrec fit`` writes it as ``runs/<name>/model``,
`NextItemTask.recommender` builds it in memory): the network (`SessionModel`), the objective it
was trained with (how it reads the next item), the vocabulary of its ids, the inference settings
serving reads (`Inference`) and, for a model that reads side features, the fitted transforms. Its
model directory (`sessrec.artifacts.model_directory`) holds the sections ``model``, ``objective``,
``inference``, ``side_features`` (with features.npz), ``vocab`` and, as ``sessrec fit`` writes it, ``data``:
the configuration of the data module the model was trained on, which the recommender carries and
never reads (a pipeline recipe rebuilds its sessions from it), and ``train_end``: the time of the
training split's last event, which ``sessrec retrain`` reads so that no turn goes back in time; the network and the objective
are built from their sections by the registry (`sessrec.saved.registry`), the only builder of
classes from saved files.

Shape letters: B sessions, L positions, V items.

Examples:
    >>> import tempfile, numpy as np, pyarrow as pa, torch
    >>> from sessrec.data import ItemVocab
    >>> from sessrec.models import CausalLanguageModeling, GRU4RecEncoder, SessionModel
    >>> vocab = ItemVocab.fit(pa.array(np.arange(1, 9)))
    >>> model = SessionModel(len(vocab), GRU4RecEncoder(d_model=8), max_length=5).eval()
    >>> saved = SessionRecommender(model, CausalLanguageModeling(), vocab, Inference(max_length=5))
    >>> loaded = SessionRecommender.from_pretrained(saved.save_pretrained(tempfile.mkdtemp() + "/model"))
    >>> loaded.vocab == vocab, loaded.inference.max_length
    (True, 5)
    >>> items = torch.tensor([[0, 3, 4]])
    >>> torch.equal(loaded.scores(items), saved.scores(items))
    True
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sessrec.artifacts.model_directory import (
    CONFIG,
    NETWORK,
    OBJECTIVE,
    WEIGHTS,
    load_into,
    load_side,
    load_vocab,
    load_weights,
    read_model_directory,
    read_train_end,
    under,
    with_prefix,
    write_model_directory,
)
from sessrec.data.side import SideFeatures
from sessrec.data.vocab import ItemVocab
from sessrec.features.side_transform import SideFeatureTransform
from sessrec.models.objective import Objective, latest
from sessrec.models.session_model import SessionModel, next_item_scores
from sessrec.saved.registry import ConfigError, check_integers, config_of, instantiate


@dataclass(frozen=True)
class Inference:
    """What serving a session model reads besides its weights.

    Args:
        max_length: items of a session read (its latest ones); the network adds its [MASK] slot.
        exclude_seen: never recommend an item of the input session.
        top_k: recommendations per session by default (``sessrec predict``, export with top-k outputs).
    """

    max_length: int
    exclude_seen: bool = False
    top_k: int = 20

    def __post_init__(self) -> None:
        check_integers({"max_length": self.max_length, "top_k": self.top_k}, "inference ")
        if not isinstance(self.exclude_seen, bool):
            raise ValueError(f"inference exclude_seen must be true or false, got {self.exclude_seen!r}")  # noqa: TRY004

    @classmethod
    def read(cls, section: Any, source: str, key: str = "inference") -> Inference:
        """The settings a config's ``inference`` section holds; one `ConfigError` line for anything else."""
        if not isinstance(section, dict):
            raise ConfigError(source, key, f"expected a mapping of max_length, exclude_seen, top_k, got {type(section).__name__}")
        unknown = sorted(map(str, section.keys() - {"max_length", "exclude_seen", "top_k"}))
        if unknown:
            raise ConfigError(source, key, f"unknown settings {unknown}; it holds max_length, exclude_seen, top_k")
        try:
            return cls(**section)
        except (TypeError, ValueError) as err:
            raise ConfigError(source, key, str(err)) from None


class SessionRecommender:
    """A trained session model, the objective it was trained with, its vocabulary and inference settings.

    Args:
        model: the trained network (kept in the mode it is in; `from_pretrained` gives it in eval mode).
        objective: the objective it was trained with, bound to `model` (how the next item is read).
        vocab: the vocabulary of its ids: as many ids as the network scores, its virtual ids the network's.
        inference: the session length, exclusion of seen items and top-k that serving reads.
        side_transform: the fitted side-feature transforms, for a model that reads side features; refused
            when their features or numbers of ids are not those the network embeds.
        side_features: their settings (default: the transforms' own).
        data: the ``{"class_path", "init_args"}`` configuration (plain data) of the data module it was
            trained on, as ``sessrec fit`` records it; None when unknown (a recommender built by hand).
            Carried through `save_pretrained` / `from_pretrained`, not interpreted.
        train_end: time (epoch seconds, UTC) of the last event of the training split it was trained on, as
            ``sessrec fit`` and ``sessrec retrain`` record it; None when unknown.
    """

    def __init__(
        self,
        model: SessionModel,
        objective: Objective,
        vocab: ItemVocab,
        inference: Inference,
        side_transform: SideFeatureTransform | None = None,
        side_features: SideFeatures | None = None,
        data: dict[str, Any] | None = None,
        train_end: float | None = None,
    ) -> None:
        if not isinstance(model, SessionModel):
            raise TypeError(f"a SessionRecommender holds a SessionModel, got {type(model).__name__}")
        if not isinstance(objective, Objective):
            raise TypeError(f"a SessionRecommender's objective is an Objective, got {type(objective).__name__}")
        if not isinstance(vocab, ItemVocab):
            raise TypeError(f"a SessionRecommender's vocabulary is an ItemVocab, got {type(vocab).__name__}")
        if not isinstance(inference, Inference):
            raise TypeError(f"a SessionRecommender's inference settings are an Inference, got {type(inference).__name__}")
        if data is not None and not isinstance(data, dict):
            raise TypeError(f"a SessionRecommender's data configuration is a mapping or None, got {type(data).__name__}")
        if len(vocab) != model.num_items:
            raise ValueError(f"the vocabulary has {len(vocab)} ids where the model scores {model.num_items}: "
                             "give the vocabulary it was trained with")
        if vocab.num_virtual != model.num_virtual:
            raise ValueError(f"the vocabulary's last {vocab.num_virtual} ids are virtual (input-only) items where the model "
                             f"has {model.num_virtual}: build SessionModel with num_virtual={vocab.num_virtual} (else they would be "
                             "recommended)")
        if inference.max_length > model.max_length:
            raise ValueError(f"inference max_length {inference.max_length} is more than the {model.max_length} items "
                             "the network reads: serve at most what it was trained on")
        objective.check(model.encoder)  # a pair that cannot have been trained together
        if side_transform is not None and model.side_info is not None:
            model.side_info.check_spec(side_transform.spec, "the side-feature transforms")
        self.model, self.objective, self.vocab, self.inference = model, objective, vocab, inference
        self.side_transform = side_transform
        self.side_features = side_features if side_features is not None or side_transform is None else side_transform.config
        self.data = data
        self.train_end = train_end

    def scores(self, items: torch.Tensor, features: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """(B, V) next-item scores of (B, L) right-aligned sessions of model ids, read the way the
        objective trained the model from their latest ``inference.max_length`` items (and side features);
        the session's own items at -inf when the inference settings exclude them. A tensor that is not of
        integers, an id outside ``0 .. len(vocab) - 1`` or a row with padding after an item is a ValueError
        naming the value or the row (`sessrec.models.session_model.check_item_ids`)."""
        items, features = latest(items, features, self.inference.max_length)
        return next_item_scores(self.model, self.objective, items, features, self.inference.exclude_seen)

    def to(self, device: torch.device | str) -> SessionRecommender:
        """Move the network (and an objective's own layers) to `device`; returns self."""
        self.model.to(device)
        if isinstance(self.objective, nn.Module):
            self.objective.to(device)
        return self

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write the model directory (a new version of an existing one); returns the folder written."""
        sections = {"model": config_of(self.model), "objective": config_of(self.objective),
                    "inference": asdict(self.inference)}
        if self.data is not None:
            sections["data"] = self.data
        if self.train_end is not None:
            sections["train_end"] = float(self.train_end)
        weights = with_prefix(self.model.state_dict(), NETWORK)
        if isinstance(self.objective, nn.Module):
            weights.update(with_prefix(self.objective.state_dict(), OBJECTIVE))
        return write_model_directory(directory, sections, weights, self.vocab, self.side_transform, self.side_features)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> SessionRecommender:
        """The recommender a model directory holds (its current version), its network in eval mode.

        Refused in one line naming the file: a directory of another format version, a part that
        does not belong, a section that does not build a `SessionModel` and its objective, weights
        of another shape, a model directory of a click ranker.
        """
        folder, config = read_model_directory(directory)
        source = str(folder / CONFIG)
        if "objective" not in config:
            raise ConfigError(source, "model", "this directory holds a click ranker: load it with ClickRanker.from_pretrained")
        model = instantiate(config.get("model"), expected=SessionModel, source=source, key="model")
        objective = instantiate(config["objective"], expected=Objective, source=source, key="objective")
        try:
            objective.bind(model)
        except (TypeError, ValueError) as err:
            raise ConfigError(source, "objective", " ".join(str(err).split())) from err
        inference = Inference.read(config.get("inference"), source)
        weights = load_weights(folder)
        load_into(model, under(weights, NETWORK), str(folder / WEIGHTS))
        if isinstance(objective, nn.Module):
            load_into(objective, under(weights, OBJECTIVE), str(folder / WEIGHTS))
            objective.eval()
        vocab = load_vocab(folder, config, ItemVocab.load)
        side_transform, side_features = load_side(folder, config)
        data = config.get("data")
        if data is not None and not isinstance(data, dict):
            raise ConfigError(source, "data", f"expected the data module's {{class_path, init_args}}, got {type(data).__name__}")
        return cls(model.eval(), objective, vocab, inference, side_transform, side_features, data,
                   read_train_end(config, source))
