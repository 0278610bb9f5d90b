"""The four-stage pipeline: retrieval -> filtering -> scoring -> ordering, offline and online."""

from sessrec.pipeline.candidates import Candidates, Recommendations, Retrieved, Sessions, merge

__all__ = ["Candidates", "Recommendations", "Retrieved", "Sessions", "merge"]
