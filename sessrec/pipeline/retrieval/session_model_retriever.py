"""`SessionModelRetriever`: top-K of a trained session model over the whole catalogue.

The model's next-item score is an inner product plus a bias: ``s(i) = <q, e_i> + b_i`` with
``q`` the transformed (and, for cosine models, normalised and scaled) session state and ``e_i``
the (normalised) item embedding. Appending 1 to the query and ``b_i`` to each item vector makes
it a plain inner product, so an index over the ``(V', D + 1)`` item table of the recommendable
items returns exactly the model's top-K: `ExactIndex` by a blocked product (bounded memory),
`FaissIndex` approximately and faster on large catalogues.

The query runs in PyTorch (``runtime="torch"``) or as an ONNX graph of the same computation in
onnxruntime on one thread (``runtime="onnxruntime"``): a request's query is a few dozen small
operations, whose dispatch onnxruntime pays a fifth of (`benchmarks/pipeline_latency.py --runtimes`).
The graph is exported when the query is first needed and saved with the weights, and refused at load
unless it gives the weights' queries; its queries are eager PyTorch's within float rounding (1e-6 of
a query's scale), so one runtime is chosen per retriever and kept wherever it runs (fit, test, serve).

Shape letters: B sessions, L positions, D model width, K candidates, V items.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from sessrec.artifacts.model_directory import NETWORK, OBJECTIVE, load_into, under, with_prefix
from sessrec.artifacts.session_recommender import SessionRecommender
from sessrec.models.objective import EVENT_TIMES, Objective
from sessrec.models.onnx_graph import (
    OnnxSession,
    example_items,
    example_times,
    first_line,
    max_abs_diff,
    onnx_limit,
    to_onnx,
)
from sessrec.models.session_model import SessionModel
from sessrec.pipeline.candidates import RequestSessions, Retrieved
from sessrec.pipeline.retrieval.index import ExactIndex, FaissIndex
from sessrec.pipeline.retrieval.retriever import Retriever

AnyIndex = ExactIndex | FaissIndex
Runtime = Literal["torch", "onnxruntime"]
NORMALIZE_EPS = 1e-12  # `F.normalize`'s default, with which `item_vectors` normalises the index's rows
GRAPH_TOLERANCE = 1e-4  # max |graph - eager| of a query's entries (its scale: up to score_scale) at export and load


class SessionModelRetriever(Retriever):
    """Retrieve with a trained `SessionModel` (any encoder and objective of the zoo).

    Args:
        model: the trained network (used in eval mode).
        objective: the objective it was trained with, bound to the model (a `SessionRecommender`'s),
            which says how the next item is read (default: `SessionModel.default_objective`).
        index: `ExactIndex` (default) or `FaissIndex` over the item vectors, built on first use.
        runtime: where the query runs: ``"torch"`` (eager) or ``"onnxruntime"`` (its ONNX graph, on the
            CPU; needs the pipeline extra's onnx, onnxscript and onnxruntime; not for GRU4Rec, which
            does not export to ONNX).
        max_length: the latest items of a session the query reads (a `SessionRecommender`'s
            ``inference.max_length``, which may be fewer than the network's); None: the network's.

    Its config records the network's, the objective's and the index's configs and the runtime; its
    state is the weights, keyed as a model directory's (``weights``: ``model.*``, ``objective.*``),
    the built index (``index``) and, with onnxruntime, the query's graph (``query_graph``). It
    computes where the model's weights are (`to` moves them, the exact index with them).
    """

    def __init__(self, model: SessionModel, objective: Objective | None = None, index: AnyIndex | None = None,
                 runtime: Runtime = "torch", max_length: int | None = None) -> None:
        if not isinstance(model, SessionModel):
            raise TypeError(f"SessionModelRetriever takes a SessionModel (a SessionRecommender's model), got {type(model).__name__}")
        if runtime not in ("torch", "onnxruntime"):
            raise ValueError(f"runtime must be 'torch' or 'onnxruntime', got {runtime!r}")
        why = onnx_limit(model.encoder) if runtime == "onnxruntime" else None
        if why is not None:
            name = type(model.encoder).__name__.removesuffix("Encoder")
            raise ValueError(f"runtime='onnxruntime': {name}'s query does not export to ONNX ({why}); use runtime='torch'")
        if max_length is not None and not 1 <= max_length <= model.max_length:
            raise ValueError(f"max_length must be between 1 and the network's {model.max_length} items, got {max_length}")
        if objective is None:
            objective = model.default_objective()
        objective.check(model.encoder)  # a pair that cannot have been trained together
        self.model, self.objective = model.eval(), objective
        self.index = index if index is not None else ExactIndex()
        self.runtime = runtime
        self.max_length = model.max_length if max_length is None else max_length
        self._check_device(self.device)
        self._query = Query(model, objective)
        self._graph: OnnxSession | None = None  # the query's ONNX graph
        # the config names the objective and the index in use, also when they were defaults
        self._init_args.update(objective=self.objective, index=self.index)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, index: AnyIndex | None = None) -> SessionModelRetriever:
        """The session model of a model directory (``runs/<name>/model``, `SessionRecommender.from_pretrained`)
        as a retriever."""
        recommender = SessionRecommender.from_pretrained(directory)
        return cls(recommender.model, recommender.objective, index, max_length=recommender.inference.max_length)

    @property
    def needs_times(self) -> bool:
        """Whether the model was trained with event times (`SessionModel.needs_times`): sessions without them are refused."""
        return self.model.needs_times

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        return self.model.item_embedding.weight.device

    def to(self, device: torch.device | str) -> SessionModelRetriever:
        """Move the model (and an objective's own layers) and the index to `device`; returns self.

        Raises:
            ValueError: another device than the CPU for a retriever whose query runs in onnxruntime.
        """
        self._check_device(torch.device(device))
        self.model.to(device)
        if isinstance(self.objective, torch.nn.Module):
            self.objective.to(device)
        self.index.to(device)
        return self

    def _check_device(self, device: torch.device) -> None:
        if self.runtime == "onnxruntime" and device.type != "cpu":
            raise ValueError(f"this retriever's query runs in onnxruntime on the CPU (runtime='onnxruntime'): its model "
                             f"cannot be on {device}; build it with runtime='torch' to run on {device}")

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
        table = model.item_embedding.weight.index_select(0, ids)
        if model.score_scale is not None:
            table = F.normalize(table, dim=-1)
        return torch.cat([table, model.output_bias.index_select(0, ids).unsqueeze(1)], dim=1).float().contiguous(), ids

    @torch.no_grad()
    def query_vectors(self, sessions: RequestSessions) -> torch.Tensor:
        """(B, D + 1) query of each session (1 last), cached on the batch. An encoder that reads event
        times (`HSTUEncoder`) gets the sessions' times where the request carries them; one trained with
        them refuses sessions without them (ValueError)."""
        key = f"query:{id(self)}"
        if key not in sessions.cache:
            items = sessions.items[:, -self.max_length:]  # right-aligned: the latest items the model is served on
            times = sessions.times if self.model.uses_times else None  # an encoder that reads them (HSTU) gets them
            if times is not None:
                times = times[:, -self.max_length:]
            if times is None and self.needs_times:
                raise ValueError(f"this retriever's {type(self.model.encoder).__name__} was trained with event times and "
                                 "these sessions carry none: give the sessions their times")
            if self.runtime == "torch":
                sessions.cache[key] = self._query(items, *(() if times is None else (times,)))
            elif self.model.uses_times and times is None:
                raise ValueError(f"this retriever's {type(self.model.encoder).__name__} query runs in onnxruntime on the "
                                 "sessions' event times (its graph reads them), and these sessions carry none: give the "
                                 "sessions their times, or build the retriever with runtime='torch'")
            else:
                inputs = {"items": items.long().cpu().numpy()}  # the graph's dtypes: int64 ids, float64 seconds
                if times is not None:
                    inputs[EVENT_TIMES] = times.double().cpu().numpy()
                sessions.cache[key] = torch.from_numpy(self.query_graph().run(inputs)[0])
        return sessions.cache[key]

    def query_graph(self) -> OnnxSession:
        """The query's onnxruntime session, exported now (and checked against eager PyTorch) if not yet (nor loaded)."""
        if self._graph is None:
            self._graph = self._checked(self._export(), "exported")
        return self._graph

    def _export(self) -> bytes:
        query, example = self._query, self._example(2, min(self.model.max_length, 8))
        names = ["items", *([EVENT_TIMES] if self.model.uses_times else [])]
        dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("length")}
        shapes = (dims, (dims,)) if self.model.uses_times else (dims,)
        try:
            with torch.no_grad():
                proto = to_onnx(query, example, names, ["query"], shapes)
        except ModuleNotFoundError:
            raise
        except Exception as err:  # the exporter raises many types; one clear line, the cause chained
            raise ValueError(f"runtime='onnxruntime': the {type(self.model.encoder).__name__} query cannot be exported "
                             f"to ONNX: {first_line(err)}; use runtime='torch'") from err
        return proto.SerializeToString()

    def _checked(self, data: bytes, what: str) -> OnnxSession:
        """`data`'s session when the graph gives eager PyTorch's queries within `GRAPH_TOLERANCE` on sessions
        of other shapes than the export example's (batches of 1 and 5, lengths 1, 3 and the model's); else ValueError."""
        session, query = OnnxSession(data), self._query
        for batch, length in ((1, 1), (5, 3), (1, self.model.max_length), (5, self.model.max_length + 2)):
            example = self._example(batch, length)
            with torch.no_grad():
                expected = query(*example).cpu().numpy()
            inputs = dict(zip(session.input_names, (t.cpu().numpy() for t in example)))
            try:
                actual = session.run(inputs)[0]
            except Exception as err:  # onnxruntime's own error types
                raise ValueError(f"the {what} query graph does not run on sessions of shape ({batch}, {length}): "
                                 f"{first_line(err)}") from err
            diff = max_abs_diff(actual, expected)
            if not diff <= GRAPH_TOLERANCE:
                raise ValueError(f"the {what} query graph gives other queries than the retriever's weights (by {diff:.3g} "
                                 f"on sessions of shape ({batch}, {length})): the graph and the weights do not belong together")
        return session

    def _example(self, batch: int, length: int) -> tuple[torch.Tensor, ...]:
        """Sessions (B, L) of recommendable items with left padding, and their times for an encoder that reads them."""
        g = torch.Generator().manual_seed(batch * 1000 + length)
        items = example_items(self.model.recommendable, batch, length, g)
        return (items, example_times(batch, length, g)) if self.model.uses_times else (items,)

    # -- the verbs ------------------------------------------------------------------------------
    def retrieve(self, sessions: RequestSessions, k: int) -> Retrieved:
        scores, items = self.built_index().search(self.query_vectors(sessions), k)
        return Retrieved(items=items, scores=scores)

    @torch.no_grad()
    def score(self, sessions: RequestSessions, items: torch.Tensor) -> torch.Tensor:
        q = self.query_vectors(sessions)  # (B, D + 1), 1 last
        model, flat = self.model, items.reshape(-1)
        table = model.item_embedding.weight.index_select(0, flat)  # (B K, D): gathers, one product per session
        if model.score_scale is not None:  # `F.normalize`'s division, in place: no second (B K, D) buffer to fault in
            table.div_(table.norm(2, -1, keepdim=True).clamp_min_(NORMALIZE_EPS))
        bias = model.output_bias.index_select(0, flat).view(*items.shape, 1)
        return torch.baddbmm(bias, table.view(*items.shape, -1), q[:, :-1].unsqueeze(2)).squeeze(2).float()

    # -- saving ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``weights`` (the network's under ``model.``, an objective's own under ``objective.``) and
        ``index`` (the built index's state)."""
        weights = with_prefix(self.model.state_dict(), NETWORK)
        if isinstance(self.objective, torch.nn.Module):
            weights.update(with_prefix(self.objective.state_dict(), OBJECTIVE))
        state = {"weights": {k: v.detach().cpu().numpy() for k, v in weights.items()},
                 "index": self.built_index().state_dict()}
        if self.runtime == "onnxruntime":
            self.query_graph()
            state["query_graph"] = np.frombuffer(self._graph.data, dtype=np.uint8)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> SessionModelRetriever:
        """Bind the objective to the network (building an objective's own layers), load the weights
        (shapes checked), the index and, with onnxruntime, the query's graph (checked against the
        weights); returns self.

        Raises:
            ValueError: a query graph without runtime='onnxruntime' or none with it, or a graph that
                does not give the weights' queries.
        """
        if ("query_graph" in state) != (self.runtime == "onnxruntime"):
            has = "holds a query graph" if "query_graph" in state else "holds no query graph"
            raise ValueError(f"the retriever's state {has}, but its config says runtime={self.runtime!r}: "
                             "the config and the weights do not belong together")
        self.objective.bind(self.model)
        weights = {k: torch.from_numpy(np.array(v)) for k, v in state["weights"].items()}
        load_into(self.model, under(weights, NETWORK), "the retriever's weights")
        if isinstance(self.objective, torch.nn.Module):
            load_into(self.objective, under(weights, OBJECTIVE), "the retriever's weights")
            self.objective.eval()
        self.model.eval()
        self.index.load_state_dict(state["index"]).to(self.device)
        self._graph = None
        if self.runtime == "onnxruntime":
            self._graph = self._checked(np.asarray(state["query_graph"], dtype=np.uint8).tobytes(), "saved")
        return self


class Query(torch.nn.Module):
    """A session model's query: (B, L) items [, (B, L) event times] -> (B, D + 1) float32, 1 last (what
    `SessionModelRetriever.query_vectors` returns; the module its ONNX graph is exported from).

    Args:
        model: the network (eval mode).
        objective: how it reads the next item.
    """

    def __init__(self, model: SessionModel, objective: Objective) -> None:
        super().__init__()
        self.model = model
        object.__setattr__(self, "objective", objective)  # not a submodule: no training-only layers in the graph
        self.eval()

    def forward(self, items: torch.Tensor, *times: torch.Tensor) -> torch.Tensor:
        model = self.model
        hidden = self.objective.next_item_hidden(model, items, {EVENT_TIMES: times[0]} if times else None)  # (B, D)
        q = model.output_transform(hidden)
        if model.score_scale is not None:
            q = F.normalize(q, dim=-1) * model.score_scale
        return torch.cat([q, q.new_ones(q.shape[0], 1)], dim=1).float()  # shape[0], not len(): a symbolic batch axis
