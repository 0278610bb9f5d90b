"""LightningModules and callbacks: losses, metrics, optimisation, checkpoint side files; the typed
parts of a task's config (`Optimization`, `Schedule`, `Evaluation`)."""

from sessrec.tasks.baseline import BaselineTask
from sessrec.tasks.callbacks import LastCheckpoint, TopKWriter, VocabularyCheckpoint
from sessrec.tasks.next_item import NextItemTask, TopK
from sessrec.tasks.ranking import DLRMTask, RankingMetrics
from sessrec.tasks.settings import Evaluation, Optimization, Schedule
from sessrec.tasks.sharded import TorchRecStrategy

__all__ = [
    "BaselineTask", "DLRMTask", "Evaluation", "LastCheckpoint", "NextItemTask", "Optimization", "RankingMetrics", "Schedule",
    "TopK", "TopKWriter", "TorchRecStrategy", "VocabularyCheckpoint",
]
