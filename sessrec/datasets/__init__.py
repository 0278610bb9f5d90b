"""Dataset adapters: sources and row builders for one dataset's format each, on top of `sessrec.data`.

- `trivago`: `TrivagoSource`, the RecSys Challenge 2019 log as item sessions (clicked hotels);
- `clickouts`: `build_clickout_rows`, one ranking row per (click-out, shown hotel) of that log;
- `clickout_rows`: those rows fitted (`RankingVocab`), encoded (`RankingTensors`) and served in
  batches (`RankingBatch`, `RankingLoader`) for `DLRMTask`;
- `criteo`: `generate_criteo`, synthetic Criteo-like click rows (13 dense, 26 sparse features).

No default points at a data folder: every path is an argument.
"""

from sessrec.datasets.clickout_rows import (
    RankingBatch,
    RankingLoader,
    RankingTensors,
    RankingVocab,
    encode_rows,
)
from sessrec.datasets.clickouts import build_clickout_rows
from sessrec.datasets.criteo import CriteoLike, generate_criteo
from sessrec.datasets.trivago import TrivagoSource

__all__ = [
    "CriteoLike", "RankingBatch", "RankingLoader", "RankingTensors", "RankingVocab", "TrivagoSource",
    "build_clickout_rows", "encode_rows", "generate_criteo",
]
