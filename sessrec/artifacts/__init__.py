"""Trained things as model directories, one class per kind, each the only owner of its directory.

- `SessionRecommender`: a session model, its objective, vocabulary, inference settings and
  side-feature transforms (what `NextItemTask` trains).
- `ClickRanker`: a DLRM and the vocabulary of its sparse ids (what `DLRMTask` trains).

Each saves itself with ``save_pretrained(directory)`` and loads with ``from_pretrained(directory)``
(`artifact_class` names the class a directory holds, `load_artifact` loads with it), without Lightning (`sessrec.artifacts.model_directory` describes the directory). ``sessrec fit``
writes the artifact of its best checkpoint as ``runs/<name>/model``; every later step (test,
predict, serve, export, pipelines, ensembles, teachers, retrain) takes that directory.
"""

import os
from collections.abc import Mapping
from typing import Any

from sessrec.artifacts.click_ranker import ClickRanker
from sessrec.artifacts.model_directory import read_model_directory
from sessrec.artifacts.session_recommender import Inference, SessionRecommender

__all__ = ["ClickRanker", "Inference", "SessionRecommender", "artifact_class", "artifact_class_of", "load_artifact"]


def artifact_class(directory: str | os.PathLike) -> type[SessionRecommender] | type[ClickRanker]:
    """The class of the artifact a model directory holds (`artifact_class_of` its ``config.json``); a directory it
    cannot read is refused in one line."""
    _, config = read_model_directory(directory)
    return artifact_class_of(config)


def artifact_class_of(config: Mapping[str, Any]) -> type[SessionRecommender] | type[ClickRanker]:
    """The class of the artifact a model directory's ``config.json`` describes, by its sections: `SessionRecommender`
    (it has an ``objective`` section) or `ClickRanker`."""
    return SessionRecommender if "objective" in config else ClickRanker


def load_artifact(directory: str | os.PathLike) -> SessionRecommender | ClickRanker:
    """The artifact a model directory holds (`artifact_class`); each class refuses what it cannot read in one line."""
    return artifact_class(directory).from_pretrained(directory)
