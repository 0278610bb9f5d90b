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

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sessrec.artifacts.model_directory import NETWORK, OBJECTIVE, load_into, under, with_prefix
from sessrec.artifacts.session_recommender import SessionRecommender
from sessrec.models.objective import Objective
from sessrec.models.session_model import SessionModel
from sessrec.pipeline.candidates import RequestSessions, Retrieved
from sessrec.pipeline.retrieval.index import ExactIndex, FaissIndex
from sessrec.pipeline.retrieval.retriever import Retriever

AnyIndex = ExactIndex | FaissIndex


class SessionModelRetriever(Retriever):
    """Retrieve with a trained `SessionModel` (any encoder and objective of the zoo).

    Args:
        model: the trained network (used in eval mode).
        objective: the objective it was trained with, bound to the model (a `SessionRecommender`'s),
            which says how the next item is read (default: `SessionModel.default_objective`).
        index: `ExactIndex` (default) or `FaissIndex` over the item vectors, built on first use.

    Its config records the network's, the objective's and the index's configs; its state is the
    weights, keyed as a model directory's (``weights``: ``model.*``, ``objective.*``), and the
    built index (``index``). It computes where the model's weights are (`to` moves them, the
    exact index with them).
    """

    def __init__(self, model: SessionModel, objective: Objective | None = None, index: AnyIndex | None = None) -> None:
        if not isinstance(model, SessionModel):
            raise TypeError(f"SessionModelRetriever takes a SessionModel (a SessionRecommender's model), got {type(model).__name__}")
        if objective is None:
            objective = model.default_objective()
        objective.check(model.encoder)  # a pair that cannot have been trained together
        self.model, self.objective = model.eval(), objective
        self.index = index if index is not None else ExactIndex()
        # the config names the objective and the index in use, also when they were defaults
        self._init_args.update(objective=self.objective, index=self.index)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, index: AnyIndex | None = None) -> SessionModelRetriever:
        """The session model of a model directory (``runs/<name>/model``, `SessionRecommender.from_pretrained`)
        as a retriever."""
        recommender = SessionRecommender.from_pretrained(directory)
        return cls(recommender.model, recommender.objective, index)

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        return self.model.item_embedding.weight.device

    def to(self, device: torch.device | str) -> SessionModelRetriever:
        """Move the model (and an objective's own layers) and the index to `device`; returns self."""
        self.model.to(device)
        if isinstance(self.objective, torch.nn.Module):
            self.objective.to(device)
        self.index.to(device)
        return self

    # -- vectors --------------------------------------------------------------------------------
    def built_index(self) -> AnyIndex:
        """The index over the model's item vectors, built now if it is not yet (nor loaded), on the model's device."""
        if self.index.dim is None:
            self.index.build(*self.item_vectors()).to(self.device)
        return self.index

    @torch.no_grad()
    def item_vectors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(V', D + 1) item vectors (bias last) of the V' recommendable ids, and those ids (V',)."""
        model = self.model
        ids = torch.nonzero(model.recommendable).squeeze(1)
        table = model.item_embedding.weight[ids]
        if model.score_scale is not None:
            table = F.normalize(table, dim=-1)
        return torch.cat([table, model.output_bias[ids].unsqueeze(1)], dim=1).float().contiguous(), ids

    @torch.no_grad()
    def query_vectors(self, sessions: RequestSessions) -> torch.Tensor:
        """(B, D + 1) query of each session (1 last), cached on the batch. An encoder that reads event
        times (`HSTUEncoder`) gets the sessions' times where the request carries them."""
        key = f"query:{id(self)}"
        if key not in sessions.cache:
            model = self.model
            features = model.batch_features(sessions)  # {EVENT_TIMES: times} for such an encoder, else None
            hidden = self.objective.next_item_hidden(model, sessions.items, features)  # (B, D)
            q = model.output_transform(hidden)
            if model.score_scale is not None:
                q = F.normalize(q, dim=-1) * model.score_scale
            sessions.cache[key] = torch.cat([q, torch.ones(len(q), 1, dtype=q.dtype, device=q.device)], dim=1).float()
        return sessions.cache[key]

    # -- the verbs ------------------------------------------------------------------------------
    def retrieve(self, sessions: RequestSessions, k: int) -> Retrieved:
        scores, items = self.built_index().search(self.query_vectors(sessions), k)
        return Retrieved(items=items, scores=scores)

    @torch.no_grad()
    def score(self, sessions: RequestSessions, items: torch.Tensor) -> torch.Tensor:
        q = self.query_vectors(sessions)  # (B, D + 1)
        model = self.model
        table = model.item_embedding.weight[items]  # (B, K, D)
        if model.score_scale is not None:
            table = F.normalize(table, dim=-1)
        return (torch.einsum("bkd,bd->bk", table, q[:, :-1]) + model.output_bias[items]).float()

    # -- saving ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``weights`` (the network's under ``model.``, an objective's own under ``objective.``) and
        ``index`` (the built index's state)."""
        weights = with_prefix(self.model.state_dict(), NETWORK)
        if isinstance(self.objective, torch.nn.Module):
            weights.update(with_prefix(self.objective.state_dict(), OBJECTIVE))
        return {"weights": {k: v.detach().cpu().numpy() for k, v in weights.items()},
                "index": self.built_index().state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> SessionModelRetriever:
        """Bind the objective to the network (building an objective's own layers), load the weights
        (shapes checked) and the index; returns self."""
        self.objective.bind(self.model)
        weights = {k: torch.from_numpy(np.array(v)) for k, v in state["weights"].items()}
        load_into(self.model, under(weights, NETWORK), "the retriever's weights")
        if isinstance(self.objective, torch.nn.Module):
            load_into(self.objective, under(weights, OBJECTIVE), "the retriever's weights")
            self.objective.eval()
        self.model.eval()
        self.index.load_state_dict(state["index"]).to(self.device)
        return self
