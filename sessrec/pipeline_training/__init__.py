"""Fitting and evaluating a pipeline (the Lightning side of `sessrec.pipeline`, which serves without it).

`recipe.py` reads a pipeline recipe (`PipelineRecipe`: the data module, the retrievers, the ranker)
and fits or tests it; `fitting.py` fits the ranker on validation candidates (`fit_ranker`) and
measures a pipeline on test pairs (`evaluate_pipeline`, `retrieval_recall`); `progress.py` prints
the steps of a long fit. ``sessrec fit|test --config <pipeline recipe>`` runs them.
"""

from sessrec.pipeline_training.fitting import evaluate_pipeline, fit_ranker, retrieval_recall
from sessrec.pipeline_training.recipe import PipelineRecipe

__all__ = ["PipelineRecipe", "evaluate_pipeline", "fit_ranker", "retrieval_recall"]
