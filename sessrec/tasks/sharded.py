"""`TorchRecStrategy`: Lightning's data parallelism with the embedding tables sharded by TorchRec.

Lightning's ``ddp`` copies the whole model to every process; tables too large for one device
must instead be split. This strategy keeps Lightning's launch, process group, loaders sharded by
rank, metric reduction and checkpoint callbacks, and replaces its model wrapping: at the start of
fitting, the TorchRec ``EmbeddingBagCollection``s of one submodule (a `DLRM` built with
``sparse: TorchRecTables``) are planned by our `ShardingPlanner`, placed by TorchRec's
``DistributedModelParallel`` and started from the same weights in every process; the rest of
that submodule is replicated and its gradients averaged by the data-parallel wrapper TorchRec
puts around it.

Checkpoints hold the unsharded state dict (the shards of all ranks assembled), so the model
directory ``sessrec fit`` writes from the best one is read in one process as usual, and after
fitting every process holds the whole trained model again. Whole tables must therefore fit in
one host's memory, though not in one device's.

Example (recipe)::

    trainer:
      devices: 2
      strategy:
        class_path: sessrec.tasks.TorchRecStrategy
        init_args: {device_memory_bytes: 1073741824}
    model:
      init_args:
        sparse: {class_path: sessrec.embeddings.TorchRecTables}
"""

from __future__ import annotations

from typing import Any, Literal

from pytorch_lightning.strategies import DDPStrategy

from sessrec.embeddings import ShardingPlan, ShardingPlanner, TableConfig
from sessrec.embeddings.planner import Optimizer, Placement
from sessrec.embeddings.sharding import full_state_dict, load_full_state_dict, require_torchrec, shard_model


class TorchRecStrategy(DDPStrategy):
    """DDP for the dense parts, TorchRec sharding for the embedding tables of ``module``.

    Args:
        module: the LightningModule's attribute holding the model to shard (``model`` in `DLRMTask`).
        device_memory_bytes: memory each process gives to its tables and their optimizer state
            (the planner's budget).
        table_optimizer: the optimizer that updates the tables, for the planner's state bytes
            (``adam`` for `DLRMTask`'s dense optimizer).
        data_parallel_max_bytes: tables up to this size are replicated instead of sharded.
        constraints: a placement per table name (``table_wise``, ``row_wise``, ``column_wise``,
            ``data_parallel``), overriding the planner's choice.
        start_method: how Lightning starts the processes (``popen`` re-runs the command, as ``ddp``;
            ``spawn`` as ``ddp_spawn``).
        **kwargs: passed to Lightning's ``DDPStrategy``.
    """

    def __init__(
        self,
        module: str = "model",
        device_memory_bytes: int = 8 << 30,
        table_optimizer: Optimizer = "adam",
        data_parallel_max_bytes: int = 1 << 20,
        constraints: dict[str, Placement] | None = None,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        **kwargs: Any,
    ) -> None:
        require_torchrec()
        super().__init__(start_method=start_method, **kwargs)
        self.module_name = module
        self.device_memory_bytes = device_memory_bytes
        self.table_optimizer = table_optimizer
        self.data_parallel_max_bytes = data_parallel_max_bytes
        self.constraints = dict(constraints or {})
        self.plan: ShardingPlan | None = None
        self._collections: list[tuple[Any, str, Any]] = []  # (parent module, attribute, unsharded collection)

    def _tables(self, model: Any) -> list[TableConfig]:
        from torchrec import EmbeddingBagCollection

        tables = [
            TableConfig(c.name, c.num_embeddings, c.embedding_dim, pooling=c.pooling.value.lower(),
                        feature_names=tuple(c.feature_names))
            for m in model.modules() if isinstance(m, EmbeddingBagCollection) for c in m.embedding_bag_configs()
        ]
        if not tables:
            raise ValueError(
                f"TorchRecStrategy shards TorchRec embedding tables, but {type(model).__name__} (the LightningModule's "
                f"{self.module_name!r}) has none: build the DLRM with sparse: TorchRecTables()"
            )
        return tables

    def configure_ddp(self) -> None:
        """Shard the tables of ``module`` (the replicated rest is wrapped in DDP by TorchRec)."""
        from torchrec import EmbeddingBagCollection

        module = self.lightning_module
        model = getattr(module, self.module_name)
        datamodule = getattr(module.trainer, "datamodule", None)
        planner = ShardingPlanner(
            world_size=self.world_size, device_memory_bytes=self.device_memory_bytes,
            batch_size=int(getattr(datamodule, "batch_size", 1)), optimizer=self.table_optimizer,
            data_parallel_max_bytes=self.data_parallel_max_bytes,
        )
        self.plan = planner.plan(self._tables(model), constraints=self.constraints)
        full = {k: v.detach().clone() for k, v in model.state_dict().items()}  # the same on every rank (seeded)
        # TorchRec swaps each collection for its sharded version inside `model`; keep the originals,
        # emptied, to swap back after fitting
        self._collections = [
            (parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if isinstance(child, EmbeddingBagCollection)
        ]
        sharded = shard_model(model, self.plan, device=self.root_device)
        load_full_state_dict(sharded, full)
        for _, _, collection in self._collections:
            collection.to("meta")
        setattr(module, self.module_name, sharded)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The unsharded state dict (a collective: Lightning calls it in every rank when saving)."""
        return full_state_dict(self.lightning_module.state_dict(), self.root_device)

    def teardown(self) -> None:
        """After fitting, every rank holds the whole trained model again (unsharded, in ``module``)."""
        if self._collections:
            module = self.lightning_module
            sharded = getattr(module, self.module_name)
            full = full_state_dict(sharded.state_dict(), self.root_device)
            model = sharded.module  # the model itself, its collections now sharded
            for parent, name, collection in self._collections:
                setattr(parent, name, collection.to_empty(device=self.root_device))
            model.load_state_dict(full)
            setattr(module, self.module_name, model)
            self._collections = []
        super().teardown()
