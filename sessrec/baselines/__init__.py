"""Non-neural next-item baselines, evaluated exactly like the neural models.

`Popularity`, `VSKNN` and `STAN` fit on the training sessions of a `SessionDataModule` and
score batches of prefixes over the full catalogue ((B, V), padding/OOV at -inf). In the CLI
they run inside `sessrec.tasks.BaselineTask`:
``sessrec test --config recipes/data/diginetica.yaml --config recipes/model/vsknn.yaml``.
"""

from sessrec.baselines.baseline import SessionBaseline
from sessrec.baselines.popularity import Popularity
from sessrec.baselines.stan import STAN
from sessrec.baselines.vsknn import VSKNN

__all__ = ["STAN", "VSKNN", "Popularity", "SessionBaseline"]
