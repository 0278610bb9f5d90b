"""`DLRMTask`: training and evaluation of a `DLRM` scorer on ranking rows (e.g. trivago click-outs).

Loss: binary cross-entropy on logits. Evaluation, for validation and test: AUC over all rows,
log-loss, and per query (a click-out and its shown hotels) the reciprocal rank of the clicked row
(MRR) and whether it is in the top k (recall@k). Queries without a click are left out of MRR and
recall (in trivago one click-out of 13,597 clicked a hotel that was not shown). The reference
rankers the batches carry (``position``: as displayed; ``popularity``: training clicks) are scored
on the same rows with the same metrics, logged as ``{stage}/{ranker}/{metric}``.

Shape letters: B batch rows, G queries in a batch, Dd dense features.
"""

from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from sessrec.artifacts.click_ranker import ClickRanker
from sessrec.artifacts.model_directory import load_into
from sessrec.datasets.clickout_rows import RankingBatch
from sessrec.embeddings import FusedTables, SparseTables, TableConfig
from sessrec.embeddings.host_memory import retain_freed_memory
from sessrec.metrics import RankingMetrics
from sessrec.models.dlrm import DLRM
from sessrec.saved.directory import loads_no_directory
from sessrec.saved.registry import config_of, register
from sessrec.tasks.checkpointing import Pretrained
from sessrec.tasks.optim import decayed_and_rest
from sessrec.tasks.settings import DLRMNetwork, Evaluation, Optimization

PARTS = ("network", "sparse", "optimization", "evaluation")  # DLRMTask's typed parts, as plain data in hparams


@register
class DLRMTask(Pretrained, pl.LightningModule):
    """Click prediction with a `DLRM`, evaluated as a ranking of each query's rows.

    In a recipe::

        model:
          class_path: sessrec.tasks.DLRMTask
          init_args:
            network: {embedding_dim: 16, dense_layers: [64, 16], over_layers: [128, 64], interaction: dot}
            sparse:
              class_path: sessrec.embeddings.FusedTables
              init_args: {optimizer: adagrad_rowwise, lr: 0.003}
            optimization: {lr: 0.001}
            evaluation: {ks: [1, 5, 20]}

    Args:
        cardinalities: rows of each sparse feature's table; linked from the data module
            (``data.cardinalities``).
        num_dense: dense features per row; linked from the data module (``data.num_dense``).
        network: the network's shape (`DLRMNetwork`): table width, bottom and top MLPs, interaction.
        sparse: the module holding the tables (`sessrec.embeddings.sparse_arch`): `FusedTables`
            (with ``optimizer`` ``adagrad_rowwise`` or ``sgd`` the tables are updated by the fused
            update during backward, never seen by the dense optimizer; with ``none`` they are plain
            parameters of the dense optimizer), `DynamicTables` (tables that grow with new ids:
            what `sessrec.lifecycle.retrain.retrain_dlrm` warm-starts on a grown vocabulary),
            `HybridTables` (hot rows on the device, the rest in host memory) or `TorchRecTables`
            (which `sessrec.tasks.TorchRecStrategy` shards across processes); None:
            ``FusedTables(optimizer="adagrad_rowwise", lr=0.05)`` (None, not an instance, so that a recipe
            naming another class gets that class's defaults).
        optimization: the dense optimizer, AdamW (`Optimization`): of the MLPs, and of the tables
            that are parameters; its weight decay is never applied to tables nor biases.
        evaluation: the recall@k cut-offs within a query (`Evaluation`'s ``ks``; its ``top_k`` is
            not read, and ``exclude_seen`` is refused).
        compile: ``torch.compile`` the dense parts (bottom MLP, interaction, top MLP); the table
            lookup stays eager (its fused update runs inside autograd's backward). ``True`` uses
            the default backend (inductor: generated C++ on CPU, Triton on CUDA; it needs a C
            compiler); a string names another ``torch.compile`` backend (e.g. ``aot_eager``).
        seed: seeds the tables' initial weights.
        retain_freed_memory: when fitting, ask glibc to keep freed host memory for reuse instead of
            returning it to the kernel (`sessrec.embeddings.host_memory.retain_freed_memory`): each
            step's pooled outputs and gradients are then recycled instead of page-faulted in anew.
            It changes malloc's settings for the whole process, every allocation of every library
            included, and keeps up to 1 GB of freed memory, so it is off unless asked for.

    The trained model leaves the task as a `ClickRanker` (`ranker`), which ``sessrec fit`` writes as
    ``runs/<name>/model``; ``sessrec test|predict --model_dir`` evaluate it with `from_ranker`.
    """

    from_pretrained = loads_no_directory(
        "{cls}.from_ranker(sessrec.artifacts.ClickRanker.from_pretrained({directory}))")

    EVALUATION_SETTINGS = ("evaluation", "compile")  # ``sessrec test --model_dir``: the given values (`sessrec.tasks.restore`)
    TRAINING_SETTINGS = ("optimization", "seed", "retain_freed_memory")  # read only while fitting

    def __init__(
        self,
        cardinalities: dict[str, int] = {},  # noqa: B006 - linked from the data module, read only
        num_dense: int = 0,
        network: DLRMNetwork = DLRMNetwork(),  # noqa: B008 - frozen
        sparse: SparseTables | None = None,
        optimization: Optimization = Optimization(),  # noqa: B008 - frozen
        evaluation: Evaluation = Evaluation(ks=[1, 5, 20]),  # noqa: B008 - frozen
        compile: bool | str = False,
        seed: int = 0,
        retain_freed_memory: bool = False,
    ) -> None:
        super().__init__()
        if not cardinalities or num_dense < 1:
            raise ValueError(
                "DLRMTask needs the sparse features' cardinalities and num_dense >= 1; in a recipe they are "
                f"linked from the data module (got cardinalities={cardinalities}, num_dense={num_dense})"
            )
        sparse = FusedTables(optimizer="adagrad_rowwise", lr=0.05) if sparse is None else sparse
        network, sparse = DLRMNetwork.of(network), SparseTables.of(sparse)
        optimization, evaluation = Optimization.of(optimization), Evaluation.of(evaluation)
        if evaluation.exclude_seen:
            raise ValueError("DLRMTask scores the rows each query shows: evaluation exclude_seen does not apply; leave it false")
        self.save_hyperparameters(ignore=list(PARTS))
        # every part as plain data (class_path + init_args): a checkpoint rebuilds the task without its recipe
        self.hparams.update({name: config_of(part) for name, part in zip(PARTS, (network, sparse, optimization, evaluation))})
        tables = [TableConfig(name, int(rows), network.embedding_dim) for name, rows in cardinalities.items()]
        self.model = DLRM(
            num_dense, tables, network.dense_layers, network.over_layers, network.interaction, network.dcn_layers,
            network.dcn_rank, sparse=sparse, seed=seed,
        )
        if compile:  # in place: parameter names, hence checkpoints, are the same as without
            backend = "inductor" if compile is True else str(compile)
            for part in (self.model.dense_arch, self.model.interaction, self.model.over_arch):
                part.compile(backend=backend)
        self.metrics = nn.ModuleDict({stage: RankingMetrics(evaluation.ks) for stage in ("val", "test")})
        self.baseline_metrics = nn.ModuleDict({
            f"{stage}_{name}": RankingMetrics(evaluation.ks, logits=False)
            for stage in ("val", "test") for name in ("position", "popularity")
        })
        self._fit_start: float | None = None

    @property
    def sparse(self) -> SparseTables:
        """The sparse module's config (`FusedTables`, `DynamicTables`, `HybridTables`, `TorchRecTables`), read
        from the hyper-parameters as `Pretrained`'s parts."""
        return SparseTables.of(self.hparams.sparse)

    def forward(self, batch: RankingBatch) -> torch.Tensor:
        return self.model(batch.dense, batch.sparse)  # (B,) logits

    def _step(self, batch: RankingBatch, stage: str) -> torch.Tensor:
        logits = self(batch)
        loss = F.binary_cross_entropy_with_logits(logits.float(), batch.labels)
        # the mean over all processes' rows (one scalar all-reduce per step under data parallelism)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "train", batch_size=len(batch), sync_dist=True)
        if stage != "train":
            self.metrics[stage].update(logits, batch.labels, batch.groups)
            for name, scores in batch.baselines.items():
                key = f"{stage}_{name}"
                if key in self.baseline_metrics:
                    self.baseline_metrics[key].update(scores, batch.labels, batch.groups)
        return loss

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None:
            self.attach_data(datamodule)
        if stage == "fit" and self._trainer is not None and self.trainer.world_size > 1 and self.sparse.fused_update:
            raise ValueError(
                f"data-parallel DLRM training ({self.trainer.world_size} processes) needs tables the dense optimizer "
                f"updates (FusedTables with optimizer: none, HybridTables or TorchRecTables): {self.sparse} updates them "
                "inside backward, which DDP does not reduce, so each process's tables would drift apart (for tables too "
                "large to copy to every process, shard them with TorchRec: docs/sharding.md)"
            )

    def on_fit_start(self) -> None:
        if self.hparams.retain_freed_memory:  # process-wide: only when asked for (see the class docstring)
            retain_freed_memory()
        self._fit_start = time.monotonic()

    def _log_metrics(self, stage: str) -> None:
        shown = []
        for name, metric in [("dlrm", self.metrics[stage])] + [
            (key.split("_", 1)[1], m) for key, m in self.baseline_metrics.items() if key.startswith(f"{stage}_")
        ]:
            if not metric.update_count:
                continue
            values = metric.compute()
            prefix = f"{stage}/" if name == "dlrm" else f"{stage}/{name}/"
            self.log_dict({prefix + k: v for k, v in values.items()})
            metric.reset()
            shown.append(f"{name}: " + " ".join(f"{k}={float(v):.4f}" for k, v in values.items()))
        if shown and not self.trainer.sanity_checking:
            elapsed = "" if self._fit_start is None else f" ({time.monotonic() - self._fit_start:.0f} s)"
            self.print(f"[{stage}] epoch {self.current_epoch} step {self.global_step}{elapsed}: " + " | ".join(shown))

    # -- the artifact (`sessrec.artifacts.ClickRanker`) -------------------------------------------
    def ranker(self) -> ClickRanker:
        """The trained model as its artifact: the network (the task's own, not a copy) and the data
        module's vocabulary."""
        if self.vocab is None:
            raise ValueError("the task has no vocabulary: train it with a data module (sessrec fit)")
        return ClickRanker(self.model, self.vocab)

    @classmethod
    def from_ranker(cls, ranker: ClickRanker, **settings: Any) -> DLRMTask:
        """A task over a trained ranker's network (its settings and weights) and vocabulary, to evaluate
        it or train on (a warm start); `settings` give the rest (`evaluation`, `optimization`, `compile`,
        `seed`: a model directory holds no training settings). A DLRM that a DLRMTask does not build
        (tables of several widths, or shared by several features) is refused in one line."""
        args = config_of(ranker.model)["init_args"]
        tables = [t["init_args"] for t in args["tables"]]
        widths = {t["embedding_dim"] for t in tables}
        plain = all(t.get("pooling", "sum") == "sum" and list(t.get("feature_names") or [t["name"]]) == [t["name"]]
                    for t in tables)
        if len(widths) != 1 or not plain:
            raise ValueError("a DLRMTask builds one summed table per feature, all of one width; this DLRM has other tables")
        network = {k: args[k] for k in ("dense_layers", "over_layers", "interaction", "dcn_layers", "dcn_rank")}
        init = {"cardinalities": {t["name"]: t["num_embeddings"] for t in tables}, "num_dense": args["num_dense"],
                "network": {"embedding_dim": widths.pop(), **network}, "sparse": args["sparse"]}
        if args.get("seed") is not None:
            init["seed"] = args["seed"]
        task = cls(**{**init, **settings})
        load_into(task.model, ranker.model.state_dict(), "the ranker's weights")
        task.vocab = ranker.vocab
        return task

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # by name: under TorchRecStrategy `self.model` is TorchRec's wrapper, and the tables its local shards
        tables = [p for n, p in self.named_parameters() if ".sparse_arch." in f".{n}"]  # none with a fused optimizer
        ids = {id(p) for p in tables}
        decay, rest = ([p for p in group if id(p) not in ids] for group in decayed_and_rest(self))  # the layers' matrices
        optimization = self.optimization
        groups = [{"params": decay, "weight_decay": optimization.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        if tables:
            groups.append({"params": tables, "weight_decay": 0.0})
        return torch.optim.AdamW(groups, lr=optimization.lr)
