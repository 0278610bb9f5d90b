"""What a model directory serves: raw-id sessions in, raw-id recommendations out.

`load_recommender` reads any saved model the library writes: a pipeline directory
(``pipeline.json``, `Pipeline.save`) or a session model directory (``config.json``,
`NextItemTask.save_pretrained`), and returns an object with the one method the server and batch
scoring call, ``recommend(sessions, k, on_unknown)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sessrec.pipeline.pipeline import Pipeline, decode_dicts, encode_raw
from sessrec.tasks import NextItemTask


class SessionRecommender:
    """A trained session model over its vocabulary: the full catalogue scored, the top `k` returned.

    Args:
        task: the trained `NextItemTask`, with its vocabulary attached (``from_pretrained`` does it).
    """

    def __init__(self, task: NextItemTask) -> None:
        if task.vocab is None:
            raise ValueError("the session model has no vocabulary: load it with NextItemTask.from_pretrained")
        if task.model.side_info is not None:
            raise ValueError(
                "this session model reads side features, which a request of item ids does not carry; "
                "serve it through sessrec predict with an event file instead"
            )
        self.task, self.vocab = task.eval(), task.vocab

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> SessionRecommender:
        return cls(NextItemTask.from_pretrained(directory))

    @torch.no_grad()
    def recommend(self, sessions: Sequence[Sequence[Any]], k: int = 20, on_unknown: str = "oov") -> list[dict[str, list]]:
        """Per session ``{"item_ids": [...], "scores": [...]}``: the `k` best-scored products, best first."""
        if isinstance(sessions, (str, bytes)) or not isinstance(sessions, Sequence):
            raise TypeError("recommend takes a list of sessions, each a list of raw item ids")
        if not sessions:
            return []
        items = encode_raw(self.vocab, sessions, int(self.task.hparams.max_length), on_unknown)
        top = self.task.recommend(items, k)
        return decode_dicts(self.vocab, top.items, top.scores.float())


def load_recommender(directory: str | os.PathLike) -> Pipeline | SessionRecommender:
    """The recommender saved in `directory`: a pipeline or a session model, by the file that describes it."""
    directory = Path(directory)
    if (directory / "pipeline.json").exists():
        return Pipeline.load(directory)
    if (directory / "config.json").exists():
        return SessionRecommender.from_pretrained(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such model directory")
    raise FileNotFoundError(
        f"{directory}: neither a saved pipeline (pipeline.json) nor a model directory (config.json); "
        "sessrec fit writes one beside the best checkpoint (runs/<name>/model)"
    )
