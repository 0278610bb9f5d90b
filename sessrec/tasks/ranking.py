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

import inspect
import time
from typing import Any, Literal

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from sessrec.datasets.clickout_rows import RankingBatch
from sessrec.embeddings import TableConfig
from sessrec.embeddings.host_memory import retain_freed_memory
from sessrec.metrics import RankingMetrics
from sessrec.models.dlrm import DLRM
from sessrec.saved.moved import forward
from sessrec.saved.registry import ConfigError, register, resolve, split_config
from sessrec.tasks.pretrained import Pretrained

# the DLRM's arguments that a DLRMTask takes under the same name
DLRM_ARGS = ("num_dense", "dense_layers", "over_layers", "interaction", "dcn_layers", "dcn_rank", "embedding_optimizer",
             "embedding_lr", "seed", "dynamic_tables", "max_rows", "sparse_backend")


@register
class DLRMTask(Pretrained, pl.LightningModule):
    """Click prediction with a `DLRM`, evaluated as a ranking of each query's rows.

    Args:
        cardinalities: rows of each sparse feature's table; linked from the data module
            (``data.cardinalities``).
        num_dense: dense features per row; linked from the data module (``data.num_dense``).
        embedding_dim: D, width of every table (and the bottom MLP's output).
        dense_layers: bottom MLP widths; the last must be `embedding_dim`.
        over_layers: top MLP hidden widths.
        interaction: ``dot`` or ``dcn`` (DCNv2 low-rank cross layers).
        dcn_layers: DCNv2 cross layers.
        dcn_rank: DCNv2 low rank.
        optimizer: the dense optimizer of the MLPs (and of the tables when `embedding_optimizer` is ``none``).
        lr: its learning rate.
        weight_decay: its weight decay (never on tables nor biases).
        embedding_optimizer: ``adagrad_rowwise`` or ``sgd``: tables updated by the embedding core's
            fused update during backward, never seen by the dense optimizer; ``none``: tables are
            plain parameters of the dense optimizer.
        embedding_lr: the fused optimizer's learning rate.
        compile: ``torch.compile`` the dense parts (bottom MLP, interaction, top MLP); the table
            lookup stays eager (its fused update runs inside autograd's backward). ``True`` uses
            the default backend (inductor: generated C++ on CPU, Triton on CUDA; it needs a C
            compiler); a string names another ``torch.compile`` backend (e.g. ``aot_eager``).
        ks: cut-offs of recall@k within a query.
        seed: seeds the tables' initial weights.
        retain_freed_memory: when fitting, ask glibc to keep freed host memory for reuse instead of
            returning it to the kernel (`sessrec.embeddings.host_memory.retain_freed_memory`,
            process-wide): each step's pooled outputs and gradients are then recycled instead of
            page-faulted in anew.
        dynamic_tables: tables that grow with new ids and evict the least used rows (`DynamicSparseArch`):
            what `sessrec.deploy.retrain.retrain_dlrm` warm-starts on a grown vocabulary.
        max_rows: the most rows a growing table holds.
        sparse_backend: ``fused`` (the embedding core) or ``torchrec`` (TorchRec's
            ``EmbeddingBagCollection``, updated by the dense optimizer: ``embedding_optimizer: none``),
            which `sessrec.tasks.TorchRecStrategy` shards across processes.

    Evaluating a checkpoint (``sessrec validate|test|predict``), `ks` and `compile` are taken from
    the recipe and the command line; the optimizers' settings, `seed` and `retain_freed_memory`
    are read only while fitting; every other setting is the checkpoint's (`sessrec.tasks.restore`).
    """

    EVALUATION_SETTINGS = ("ks", "compile")  # a checkpoint is evaluated (and run) with the given values
    # read only while fitting (embedding_optimizer is not: a row-wise Adagrad table has its momentum in the state dict)
    TRAINING_SETTINGS = ("optimizer", "lr", "weight_decay", "embedding_lr", "seed", "retain_freed_memory")
    NETWORK = DLRM  # a directory that a DLRM wrote alone loads as this task

    def __init__(
        self,
        cardinalities: dict[str, int] = {},  # noqa: B006 - linked from the data module, read only
        num_dense: int = 0,
        embedding_dim: int = 16,
        dense_layers: list[int] = [64, 16],  # noqa: B006 - read only
        over_layers: list[int] = [128, 64],  # noqa: B006 - read only
        interaction: Literal["dot", "dcn"] = "dot",
        dcn_layers: int = 2,
        dcn_rank: int = 16,
        optimizer: Literal["adam", "adamw"] = "adam",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        embedding_optimizer: Literal["adagrad_rowwise", "sgd", "none"] = "adagrad_rowwise",
        embedding_lr: float = 0.05,
        compile: bool | str = False,
        ks: list[int] = [1, 5, 20],  # noqa: B006 - read only
        seed: int = 0,
        retain_freed_memory: bool = True,
        dynamic_tables: bool = False,
        max_rows: int = 1 << 20,
        sparse_backend: Literal["fused", "torchrec"] = "fused",
    ) -> None:
        super().__init__()
        if not cardinalities or num_dense < 1:
            raise ValueError(
                "DLRMTask needs the sparse features' cardinalities and num_dense >= 1; in a recipe they are "
                f"linked from the data module (got cardinalities={cardinalities}, num_dense={num_dense})"
            )
        self.save_hyperparameters()
        tables = [TableConfig(name, int(rows), embedding_dim) for name, rows in cardinalities.items()]
        self.model = DLRM(
            num_dense, tables, dense_layers, over_layers, interaction, dcn_layers, dcn_rank,
            embedding_optimizer=embedding_optimizer, embedding_lr=embedding_lr, seed=seed,
            dynamic_tables=dynamic_tables, max_rows=max_rows, sparse_backend=sparse_backend,
        )
        if compile:  # in place: parameter names, hence checkpoints, are the same as without
            backend = "inductor" if compile is True else str(compile)
            for part in (self.model.dense_arch, self.model.interaction, self.model.over_arch):
                part.compile(backend=backend)
        self.metrics = nn.ModuleDict({stage: RankingMetrics(ks) for stage in ("val", "test")})
        self.baseline_metrics = nn.ModuleDict({
            f"{stage}_{name}": RankingMetrics(ks, logits=False)
            for stage in ("val", "test") for name in ("position", "popularity")
        })
        self._fit_start: float | None = None

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

    def training_step(self, batch: RankingBatch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: RankingBatch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "val")

    def test_step(self, batch: RankingBatch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "test")

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None:
            self.attach_data(datamodule)
        if stage == "fit" and self._trainer is not None and self.trainer.world_size > 1 and (
            self.hparams.embedding_optimizer != "none"
        ):
            raise ValueError(
                f"data-parallel DLRM training ({self.trainer.world_size} processes) needs embedding_optimizer: none: the "
                f"fused {self.hparams.embedding_optimizer!r} update runs inside backward on tables DDP does not reduce, so "
                "each process's tables would drift apart (for tables too large to copy to every process, shard them "
                "with TorchRec: docs/sharding.md)"
            )

    def on_fit_start(self) -> None:
        if self.hparams.retain_freed_memory:
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

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    # -- model directories (`sessrec.tasks.pretrained`) --------------------------------------------
    def network(self) -> DLRM:
        """The trained network with its vocabulary attached: what ``DLRM.from_pretrained`` gives for
        this task's model directory (the task's own network, not a copy)."""
        self.model.attach(self.vocab)
        return self.model

    def network_parts(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        return self.model.pretrained_parts()

    @classmethod
    def task_from_network(cls, config: dict[str, Any], source: str) -> dict[str, Any]:
        path, args = split_config(config.get("model"), source, "model")
        if resolve(path, nn.Module, source, "model") is not DLRM:
            raise ConfigError(source, "model", f"{path!r} is not a DLRM, the network a DLRMTask trains")
        args = dict(args or {})
        defaults = {k: p.default for k, p in inspect.signature(DLRM).parameters.items()}
        key = "model.init_args.tables"
        tables = [split_config(t, source, f"{key}[{i}]")[1] or {} for i, t in enumerate(args.get("tables") or [])]
        widths = {t.get("embedding_dim") for t in tables}
        plain = all(t.get("pooling", "sum") == "sum" and list(t.get("feature_names") or [t.get("name")]) == [t.get("name")]
                    for t in tables)
        if not tables or len(widths) != 1 or not plain or args.get("pad_to_bytes", 16) != 16:
            raise ConfigError(
                source, key, "a DLRMTask builds one summed table per feature, all of one width, with the "
                "default row padding; this DLRM has other tables: load the directory with DLRM.from_pretrained"
            )
        init = {k: args.get(k, defaults[k]) for k in DLRM_ARGS}
        init.update(cardinalities={t.get("name"): t.get("num_embeddings") for t in tables}, embedding_dim=widths.pop())
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": init}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # by name: under TorchRecStrategy `self.model` is TorchRec's wrapper, and the tables its local shards
        tables = [p for n, p in self.named_parameters() if ".sparse_arch." in f".{n}"]  # none with a fused optimizer
        ids = {id(p) for p in tables}
        decay = [p for p in self.parameters() if id(p) not in ids and p.dim() >= 2]
        rest = [p for p in self.parameters() if id(p) not in ids and p.dim() < 2]
        groups = [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        if tables:
            groups.append({"params": tables, "weight_decay": 0.0})
        cls = torch.optim.AdamW if self.hparams.optimizer == "adamw" else torch.optim.Adam
        return cls(groups, lr=self.hparams.lr)


__getattr__ = forward(__name__)  # the metrics that moved to sessrec.metrics, with a DeprecationWarning
