"""`SessionModelRetriever`: top-K of a trained session model over the whole catalogue.

The model's next-item score is an inner product plus a bias: ``s(i) = <q, e_i> + b_i`` with
``q`` the transformed (and, for cosine models, normalised and scaled) session state and ``e_i``
the (normalised) item embedding. Appending 1 to the query and ``b_i`` to each item vector makes
it a plain inner product, so an index over the ``(V', D + 1)`` item table of the recommendable
items returns exactly the model's top-K: `ExactIndex` by a blocked product (bounded memory),
`FaissIndex` approximately and faster on large catalogues.

Shape letters: B sessions, L positions, D model width, K candidates, V items.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
import yaml

from sessrec.pipeline.candidates import Retrieved, Sessions
from sessrec.pipeline.retrieval.base import Retriever
from sessrec.pipeline.retrieval.index import ExactIndex, FaissIndex
from sessrec.saved.registry import register, resolve
from sessrec.tasks.pretrained import build

AnyIndex = ExactIndex | FaissIndex
_DATA_LINKED = ("num_items", "max_length", "num_virtual", "side_features")


def _task_parser():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(pl.LightningModule, "model", required=True)
    return parser


def _with_class_path(model_config: Any) -> Any:
    if isinstance(model_config, dict) and "class_path" not in model_config:
        return {"class_path": "sessrec.tasks.NextItemTask", "init_args": dict(model_config)}
    return model_config


def build_task(model_config: Any, source: str = "the retriever's config", key: str = "model") -> pl.LightningModule:
    """The task of a ``model:`` block (``class_path``/``init_args``; none: `NextItemTask`).

    Built from registered classes only (`sessrec.saved.registry`), after the whole block
    resolves, so a saved pipeline never imports or runs anything its file names.
    """
    return build(_with_class_path(model_config), source, key, expected=pl.LightningModule)


def resolved_config(task_config: dict[str, Any]) -> dict[str, Any]:
    """The model block with every default filled in (JSON-able), as `build_task` reads it back."""
    parser = _task_parser()
    return json.loads(parser.dump(parser.parse_object({"model": _with_class_path(task_config)}), format="json"))["model"]


@register
class SessionModelRetriever(Retriever):
    """Retrieve with a trained `NextItemTask` (any encoder and objective of the zoo).

    Args:
        task: the trained task (its network `task.model` and objective are used, in eval mode).
        model_config: the task's recipe block with data-derived values filled in (see
            `from_checkpoint`); saved with the pipeline to rebuild the network.
        index: `ExactIndex` (default) or `FaissIndex` over the item vectors.
    """

    def __init__(self, task: pl.LightningModule, model_config: dict[str, Any], index: AnyIndex | None = None) -> None:
        self.task = task.eval()
        self.model_config = model_config
        self.index = index if index is not None else ExactIndex()
        self.index.build(*self.item_vectors())

    @classmethod
    def from_checkpoint(cls, recipe: str | Path, checkpoint: str | Path, index: AnyIndex | None = None) -> SessionModelRetriever:
        """Load the best checkpoint of ``sessrec fit --config recipe``: the network from the recipe's
        ``model:`` block, the data-derived sizes and the weights from the checkpoint."""
        recipe, checkpoint = Path(recipe), Path(checkpoint)
        for path in (recipe, checkpoint):
            if not path.exists():
                raise FileNotFoundError(f"{path}: no such file (train the model first: sessrec fit --config {recipe})")
        block = _with_class_path(dict(yaml.safe_load(recipe.read_text()).get("model") or {}))
        ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
        hparams = ckpt.get("hyper_parameters", {})
        init = dict(block.get("init_args") or {})
        init.update({k: hparams[k] for k in _DATA_LINKED if k in hparams})
        config = resolved_config({"class_path": block["class_path"], "init_args": init})
        task = build_task(config, str(recipe))
        task.load_state_dict(ckpt["state_dict"])
        return cls(task, config, index)

    # -- vectors --------------------------------------------------------------------------------
    @torch.no_grad()
    def item_vectors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(V', D + 1) item vectors (bias last) of the V' recommendable ids, and those ids (V',)."""
        model = self.task.model
        ids = torch.nonzero(model.recommendable).squeeze(1)
        table = model.item_embedding.weight[ids]
        if model.score_scale is not None:
            table = F.normalize(table, dim=-1)
        return torch.cat([table, model.output_bias[ids].unsqueeze(1)], dim=1).float().contiguous(), ids

    @torch.no_grad()
    def query_vectors(self, sessions: Sessions) -> torch.Tensor:
        """(B, D + 1) query of each session (1 last), cached on the batch."""
        key = f"query:{id(self)}"
        if key not in sessions.cache:
            model = self.task.model
            hidden = self.task.objective.next_item_hidden(model, sessions.items, None)  # (B, D)
            q = model.output_transform(hidden)
            if model.score_scale is not None:
                q = F.normalize(q, dim=-1) * model.score_scale
            sessions.cache[key] = torch.cat([q, torch.ones(len(q), 1, dtype=q.dtype)], dim=1).float()
        return sessions.cache[key]

    # -- the verbs ------------------------------------------------------------------------------
    def retrieve(self, sessions: Sessions, k: int) -> Retrieved:
        scores, items = self.index.search(self.query_vectors(sessions), k)
        return Retrieved(items=items, scores=scores)

    @torch.no_grad()
    def score(self, sessions: Sessions, items: torch.Tensor) -> torch.Tensor:
        q = self.query_vectors(sessions)  # (B, D + 1)
        model = self.task.model
        table = model.item_embedding.weight[items]  # (B, K, D)
        if model.score_scale is not None:
            table = F.normalize(table, dim=-1)
        return (torch.einsum("bkd,bd->bk", table, q[:, :-1]) + model.output_bias[items]).float()

    # -- saving ---------------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        index_config, index_arrays = self.index.state()
        arrays = {f"weights/{k}": v.detach().cpu().numpy() for k, v in self.task.state_dict().items()}
        arrays.update({f"index/{k}": v for k, v in index_arrays.items()})
        config = {"model": self.model_config, "index": index_config}  # its "type" names the index class
        return config, arrays

    @classmethod
    def from_state(cls, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> SessionModelRetriever:
        index_config = dict(config["index"])
        kind = resolve(index_config.pop("type", None), AnyIndex, "the retriever's config", "index.type")
        task = build_task(config["model"])
        weights = {k.split("/", 1)[1]: torch.from_numpy(np.array(v)) for k, v in arrays.items() if k.startswith("weights/")}
        task.load_state_dict(weights)
        index = kind.from_state(index_config, {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("index/")})
        retriever = cls.__new__(cls)
        retriever.task, retriever.model_config, retriever.index = task.eval(), config["model"], index
        return retriever
