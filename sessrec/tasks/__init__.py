"""The Lightning side: LightningModules and callbacks (losses, metrics, optimisation, prediction
writing), the typed parts of a task's config (`Optimization`, `Schedule`, `Evaluation`), and the
Lightning data modules (`SessionDataModule` for session tasks, `ClickoutDataModule` for `DLRMTask`)."""

from sessrec.metrics import RankingMetrics
from sessrec.tasks.baseline_task import BaselineTask
from sessrec.tasks.callbacks import LastCheckpoint, TopKWriter
from sessrec.tasks.clickout_data import ClickoutDataModule
from sessrec.tasks.dlrm_task import DLRMTask
from sessrec.tasks.ensemble_task import EnsembleTask
from sessrec.tasks.next_item import NextItemTask, TopK
from sessrec.tasks.session_data import SessionDataModule
from sessrec.tasks.settings import Evaluation, Optimization, Schedule
from sessrec.tasks.sharded import TorchRecStrategy

__all__ = [
    "BaselineTask", "ClickoutDataModule", "DLRMTask", "EnsembleTask", "Evaluation", "LastCheckpoint", "NextItemTask", "Optimization",
    "RankingMetrics", "Schedule", "SessionDataModule", "TopK", "TopKWriter", "TorchRecStrategy",
]
