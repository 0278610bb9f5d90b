"""`DLRMScorer`: the library's `DLRM` (embedding core + dot or DCNv2 interaction) as the ranker.

Dense inputs are the candidate features, standardised with the mean and standard deviation of
the ranker's training rows; sparse inputs are the candidate id, the last item (one shared item
table) and the hashed (last item, candidate) cross. Training is listwise: a softmax over each
session's candidates with the next item as the target (the quantity MRR rewards), early-stopped
on held-out sessions' MRR@20, the best epoch's weights kept.

Shape letters: B sessions, K candidates, F dense features, D embedding width.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from sessrec.data.jagged import SparseFeatures
from sessrec.embeddings import TableConfig
from sessrec.models.dlrm import DLRM
from sessrec.pipeline.features import RankingInputs
from sessrec.pipeline.scoring.base import Scorer, early_stopping_split, mrr_of


class DLRMScorer(Scorer):
    """Listwise-trained DLRM over the candidates.

    Args:
        embedding_dim: D, width of every table.
        dense_layers: bottom MLP (its last width is set to D).
        over_layers: top MLP hidden widths.
        interaction: ``dot`` or ``dcn``.
        sparse: the id features embedded: ``item`` (the candidate and the last item, one shared
            table) and ``cross`` (their hashed pair); ``item`` is required.
        lr: Adam learning rate.
        weight_decay: Adam weight decay.
        batch_sessions: sessions per training step (each with all its K candidates).
        max_epochs: epochs at most.
        patience: epochs without a better held-out MRR@20 before stopping.
        stop_fraction: share of the ranker's sessions held out for early stopping.
        seed: seeds the split, the weights and the shuffling.
    """

    def __init__(
        self,
        embedding_dim: int = 16,
        dense_layers: tuple[int, ...] = (64,),
        over_layers: tuple[int, ...] = (64, 32),
        interaction: Literal["dot", "dcn"] = "dot",
        sparse: tuple[str, ...] = ("item", "cross"),
        lr: float = 2e-3,
        weight_decay: float = 1e-6,
        batch_sessions: int = 128,
        max_epochs: int = 30,
        patience: int = 3,
        stop_fraction: float = 0.15,
        seed: int = 0,
    ) -> None:
        self.config = {
            "embedding_dim": embedding_dim, "dense_layers": list(dense_layers), "over_layers": list(over_layers),
            "interaction": interaction, "sparse": list(sparse), "lr": lr, "weight_decay": weight_decay, "batch_sessions": batch_sessions,
            "max_epochs": max_epochs, "patience": patience, "stop_fraction": stop_fraction, "seed": seed,
        }
        self.network: DLRM | None = None
        self.mean: torch.Tensor | None = None
        self.std: torch.Tensor | None = None
        self.sizes: dict[str, int] = {}
        self.history: list[float] = []

    def _build(self, num_dense: int, sizes: dict[str, int]) -> DLRM:
        c = self.config
        d = c["embedding_dim"]
        tables = []
        if "item" in sizes:
            tables.append(TableConfig("item", sizes["item"], d, feature_names=("item", "last_item")))
        if "cross" in sizes:
            tables.append(TableConfig("cross", sizes["cross"], d))
        torch.manual_seed(c["seed"])
        return DLRM(
            num_dense, tables, dense_layers=[*c["dense_layers"], d], over_layers=c["over_layers"],
            interaction=c["interaction"], seed=c["seed"],
        )

    def _logits(self, inputs: RankingInputs, rows: torch.Tensor) -> torch.Tensor:
        """(len(rows), K) logits of the candidates of those sessions, -inf at empty slots."""
        valid = inputs.valid[rows]
        b, k = valid.shape
        dense = ((inputs.dense[rows] - self.mean) / self.std).reshape(b * k, -1)
        ids = {n: inputs.sparse[n][rows].reshape(b * k).clamp(0, self.sizes[t] - 1)
               for n, t in (("item", "item"), ("last_item", "item"), ("cross", "cross")) if t in self.sizes}
        logits = self.network(dense, SparseFeatures.from_dense(ids)).reshape(b, k)
        return logits.masked_fill(~valid, float("-inf"))

    def fit(self, inputs: RankingInputs, labels: torch.Tensor) -> DLRMScorer:
        c = self.config
        unknown = sorted(set(c["sparse"]) - {"item", "cross"})
        if unknown or "item" not in c["sparse"]:
            raise ValueError(f"DLRMScorer sparse must hold 'item' and may hold 'cross', got {c['sparse']}")
        if "item" not in inputs.sparse:
            raise ValueError("DLRMScorer embeds the candidate and last item ids: keep the 'ids' feature group")
        train, stop = early_stopping_split(labels, c["stop_fraction"], c["seed"], inputs.groups)
        rows = inputs.dense[train][inputs.valid[train]]  # (rows, F) training rows only
        self.mean, self.std = rows.mean(dim=0), rows.std(dim=0).clamp(min=1e-6)
        self.sizes = {}
        if "item" in inputs.sparse:
            self.sizes["item"] = int(max(inputs.sparse["item"].max(), inputs.sparse["last_item"].max())) + 1
        if "cross" in inputs.sparse and "cross" in c["sparse"]:
            self.sizes["cross"] = int(inputs.sparse["cross"].max()) + 1
        self.network = self._build(inputs.dense.shape[2], self.sizes).to(inputs.dense.device)  # trains where its rows are
        opt = torch.optim.Adam(self.network.parameters(), lr=c["lr"], weight_decay=c["weight_decay"])
        target = labels.argmax(dim=1)
        gen = torch.Generator().manual_seed(c["seed"])
        best, best_state, waited = -1.0, None, 0
        self.history = []
        for _ in range(c["max_epochs"]):
            self.network.train()
            order = train[torch.randperm(len(train), generator=gen)]
            for lo in range(0, len(order), c["batch_sessions"]):
                batch = order[lo : lo + c["batch_sessions"]]
                loss = F.cross_entropy(self._logits(inputs, batch), target[batch])
                opt.zero_grad()
                loss.backward()
                opt.step()
            value = mrr_of(self._score_rows(inputs, stop), labels[stop])
            self.history.append(value)
            if value > best:
                best, waited = value, 0
                best_state = {k: v.detach().clone() for k, v in self.network.state_dict().items()}
            else:
                waited += 1
                if waited >= c["patience"]:
                    break
        self.network.load_state_dict(best_state)
        self.network.eval()
        return self

    @torch.no_grad()
    def _score_rows(self, inputs: RankingInputs, rows: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        self.network.eval()
        parts = [self._logits(inputs, rows[lo : lo + chunk]) for lo in range(0, len(rows), chunk)]
        return torch.cat(parts) if parts else torch.zeros(0, inputs.valid.shape[1], device=inputs.valid.device)

    def score(self, inputs: RankingInputs) -> torch.Tensor:
        if self.network is None:
            raise RuntimeError("DLRMScorer is not fitted")
        return self._score_rows(inputs, torch.arange(len(inputs.valid), device=inputs.valid.device)).float()

    def to(self, device: torch.device | str) -> DLRMScorer:
        """Move the network and the standardisation to `device`; returns self."""
        if self.network is not None:
            self.network.to(device)
            self.mean, self.std = self.mean.to(device), self.std.to(device)
        return self

    def state_dict(self) -> dict[str, Any]:
        """``weights`` of the network, the standardisation ``mean`` and ``std`` (F,), the table ``sizes``,
        ``num_dense`` (F) and the early-stopping ``history`` (held-out MRR@20 per epoch)."""
        if self.network is None:
            raise RuntimeError("DLRMScorer is not fitted: nothing to save")
        return {"weights": {k: v.detach().cpu().numpy() for k, v in self.network.state_dict().items()},
                "mean": self.mean.cpu().numpy(), "std": self.std.cpu().numpy(), "sizes": dict(self.sizes),
                "num_dense": int(self.mean.numel()), "history": list(self.history)}

    def load_state_dict(self, state: Mapping[str, Any]) -> DLRMScorer:
        self.sizes = {str(k): int(v) for k, v in state["sizes"].items()}
        self.history = [float(v) for v in state.get("history", [])]
        self.network = self._build(int(state["num_dense"]), self.sizes)
        self.network.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state["weights"].items()})
        self.network.eval()
        self.mean, self.std = torch.from_numpy(np.array(state["mean"])), torch.from_numpy(np.array(state["std"]))
        return self
