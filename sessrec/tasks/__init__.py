"""LightningModules and callbacks: losses, metrics, optimisation, checkpoint side files."""

from sessrec.tasks.baseline import BaselineTask
from sessrec.tasks.callbacks import LastCheckpoint, TopKWriter, VocabularyCheckpoint
from sessrec.tasks.next_item import NextItemTask, TopK
from sessrec.tasks.ranking import DLRMTask, RankingMetrics
from sessrec.tasks.sharded import TorchRecStrategy

__all__ = [
    "BaselineTask", "DLRMTask", "LastCheckpoint", "NextItemTask", "RankingMetrics", "TopK", "TopKWriter", "TorchRecStrategy",
    "VocabularyCheckpoint",
]
