"""`NextItemTask`: training, evaluation and scoring of a `SessionModel` in Lightning.

Loss, metrics and optimisation live here; the network and the objectives live in
`sessrec.models`. One shared `_step(batch, stage)` serves training (the objective's targets
inside the sessions) and evaluation (one next item after each prefix, over the full catalogue,
read the way the objective trained the model). An encoder that reads event times (`HSTUEncoder`)
gets the batches' times (`SessionBatch.times`) in training, evaluation and scoring; the task's
``uses_times`` asks the data module for them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric

from sessrec.artifacts.session_recommender import Inference, SessionRecommender
from sessrec.data.batch import SessionBatch
from sessrec.data.side import SideInfoSpec
from sessrec.metrics import TopKMetrics
from sessrec.models import MaskedItemModeling, Objective, SessionModel, XLNetEncoder
from sessrec.models.session_model import exclude_seen, next_item_scores, top_recommendable
from sessrec.models.side_info import SideInfoConfig, SideInfoEmbedding
from sessrec.saved.directory import loads_no_directory
from sessrec.saved.registry import config_of, instantiate, register
from sessrec.tasks.checkpointing import Pretrained, full_precision
from sessrec.tasks.distillation import Teachers, check_student
from sessrec.tasks.losses import CatalogueLoss, FullSoftmax
from sessrec.tasks.optim import adamw, decayed_and_rest
from sessrec.tasks.settings import Distillation, Evaluation, Optimization, Schedule

PARTS = ("optimization", "schedule", "evaluation", "distillation")  # the typed parts of the config, as plain data in hparams


@dataclass
class TopK:
    """Top-K recommendations of a batch: model ids (B, K) and scores (B, K)."""

    items: torch.Tensor
    scores: torch.Tensor


@register
class NextItemTask(Pretrained, pl.LightningModule):
    """Next-item training with a full-catalogue softmax, evaluated by Recall/NDCG/MRR@K.

    Args:
        num_items: score vector size; linked from the data module (``data.num_items``). Fitting or
            evaluating on a data module whose vocabulary has another size (or other virtual ids) is a
            ValueError at setup.
        max_length: items per session; linked from the data module (``data.max_length``). Training or
            evaluating on a data module of another ``max_length`` is a ValueError at setup.
        encoder: the sequence encoder (``class_path`` in a recipe); XLNetEncoder() when None.
        objective: the training objective, any `sessrec.models.Objective` (in a recipe
            ``{class_path: sessrec.models.<Objective>, init_args: {...}}``; a new objective is a
            subclass named by its class path). An objective that cannot train the encoder (MLM on
            a causal encoder, CLM on a bidirectional one, PLM on anything but XLNet) raises
            ValueError here, before training.
        position_embedding: learned distance-from-end embedding in the model.
        dropout: input embedding dropout.
        input_norm: LayerNorm on the input embeddings (see `SessionModel`).
        output_transform: Linear-GELU-LayerNorm before the tied head (see `SessionModel`).
        score_scale: cosine scoring with this scale (NISER); None = dot product (see `SessionModel`).
        loss: the training loss over the catalogue, any `sessrec.tasks.losses.CatalogueLoss`:
            `FullSoftmax` (default), `SampledSoftmax` (shared sampled, in-batch or mixed negatives
            with logQ correction), or a subclass named by its class path. Label smoothing and
            temperature are set on the loss. A loss that `needs_item_counts` gets the training
            counts from the data module's vocabulary at setup.
        optimization: AdamW's learning rate and weight decay (`Optimization`).
        schedule: the learning-rate schedule (`Schedule`): warm-up, then a decay over the steps
            the trainer plans; ``seconds`` adds a wall-clock budget.
        evaluation: metric cut-offs, recommendations per session, and whether the input
            session's items are excluded (`Evaluation`).
        seed: seed of the training draws (masks, negatives); each batch of each process draws its own (`draw_seed`).
        num_virtual: virtual (input-only) ids at the end of the vocabulary; linked from the data
            module (``data.num_virtual``). Never targets, never recommended.
        side_features: sizes of the side features and item vectors; linked from the data module
            (``data.side_info``). None = item ids only.
        side_info: how side information is embedded and aggregated (`SideInfoConfig`); one other than the
            default without `side_features` is a ValueError (there is nothing to embed).
        distillation: learn also towards trained teachers' next-item distribution
            (`Distillation`: their model directories, alpha, temperature;
            `sessrec.tasks.distillation`); needs `CausalLanguageModeling`, and `FullSoftmax` or
            `SampledSoftmax` (then over the negatives it draws).

    The trained model leaves the task as a `SessionRecommender` (`recommender`), which ``sessrec
    fit`` writes as ``runs/<name>/model``.
    """

    from_pretrained = loads_no_directory(
        "{cls}.from_recommender(sessrec.artifacts.SessionRecommender.from_pretrained({directory}))")

    EVALUATION_SETTINGS = ("evaluation",)  # ``sessrec test --model_dir``: the given values (`sessrec.tasks.restore`)
    TRAINING_SETTINGS = ("loss", "optimization", "schedule", "seed", "distillation")  # read only while fitting

    def __init__(
        self,
        num_items: int = 0,
        max_length: int = 20,
        encoder: nn.Module | None = None,
        objective: Objective = MaskedItemModeling(),  # noqa: B008 - a config value, never mutated
        position_embedding: bool = True,
        dropout: float = 0.1,
        input_norm: bool = False,
        output_transform: bool = False,
        score_scale: float | None = None,
        loss: CatalogueLoss = FullSoftmax(),  # noqa: B008 - a frozen-by-convention config value
        optimization: Optimization = Optimization(),  # noqa: B008 - frozen
        schedule: Schedule = Schedule(),  # noqa: B008 - frozen
        evaluation: Evaluation = Evaluation(),  # noqa: B008 - frozen
        seed: int = 0,
        num_virtual: int = 0,
        side_features: SideInfoSpec | dict | None = None,
        side_info: SideInfoConfig = SideInfoConfig(),  # noqa: B008 - a config value, never mutated
        distillation: Distillation | None = None,
    ) -> None:
        super().__init__()
        # as stored in a checkpoint, a model directory or a resolved recipe: plain configs, built here from
        # registered classes only (side_info, a dataclass, may also be given as its fields)
        if isinstance(side_info, dict) and "class_path" not in side_info:
            side_info = SideInfoConfig(**side_info)
        encoder, objective, loss, side_info = (
            instantiate(v, expected=base, source="NextItemTask", key=name) if isinstance(v, dict) else v
            for name, v, base in (("encoder", encoder, nn.Module), ("objective", objective, Objective),
                                  ("loss", loss, CatalogueLoss), ("side_info", side_info, SideInfoConfig))
        )
        if isinstance(side_features, dict):
            side_features = SideInfoSpec(**side_features)
        if side_features is None and side_info != SideInfoConfig():
            given = ", ".join(f"{k} {v}" for k, v in asdict(side_info).items() if v != getattr(SideInfoConfig(), k))
            raise ValueError(f"model.side_info ({given}) sets how side features are embedded, and the data gives none: "
                             "add them (--data.side_features.*) or drop model.side_info")
        optimization, schedule, evaluation = Optimization.of(optimization), Schedule.of(schedule), Evaluation.of(evaluation)
        distillation = None if distillation is None else Distillation.of(distillation)
        if distillation is not None:
            check_student(objective, loss)
        self.save_hyperparameters(ignore=[*PARTS, "encoder", "objective", "loss", "side_info", "side_features"])
        encoder = encoder if encoder is not None else XLNetEncoder()
        # every part as plain data (class_path + init_args): a checkpoint rebuilds the network without its
        # recipe and loads with torch.load(weights_only=True); an objective's parameters (RTD) are in the state dict
        self.hparams.update(
            encoder=config_of(encoder), objective=config_of(objective), loss=config_of(loss),
            side_info=config_of(side_info), side_features=None if side_features is None else asdict(side_features),
            optimization=config_of(optimization), schedule=config_of(schedule), evaluation=config_of(evaluation),
            distillation=config_of(distillation),
        )
        side = None
        if side_features is not None:
            side = SideInfoEmbedding(int(encoder.d_model), num_items, side_features, side_info)
        self.model = SessionModel(
            num_items=num_items,
            encoder=encoder,
            max_length=max_length,
            position_embedding=position_embedding,
            dropout=dropout,
            input_norm=input_norm,
            output_transform=output_transform,
            score_scale=score_scale,
            num_virtual=num_virtual,
            side_info=side,
        )
        self.objective = objective
        self.loss = loss
        self.objective.bind(self.model)  # refuses an invalid (encoder, objective) pair
        self.metrics = nn.ModuleDict({stage: TopKMetrics(evaluation.ks) for stage in ("val", "test")})
        self.eval_loss = nn.ModuleDict({stage: MeanMetric() for stage in ("val", "test")})
        self._clock_before, self._clock_start = 0.0, time.monotonic()
        self._teachers: Teachers | None = None  # loaded when fitting starts; never a submodule (not trained, not saved)

    @property
    def schedule(self) -> Schedule:
        """The learning-rate schedule (`Schedule`), read from the hyper-parameters as `Pretrained`'s parts."""
        return Schedule.of(self.hparams.schedule)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None:
            self.attach_data(datamodule)
        if self.vocab is not None and (len(self.vocab), self.vocab.num_virtual) != (self.model.num_items, self.model.num_virtual):
            raise ValueError(
                f"the data module's vocabulary has {len(self.vocab)} ids ({self.vocab.num_virtual} virtual) where the model "
                f"scores {self.model.num_items} ({self.model.num_virtual} virtual): build the task with "
                "num_items=datamodule.num_items and num_virtual=datamodule.num_virtual"
            )
        if self.side_transform is not None and self.model.side_info is not None:
            self.model.side_info.check_spec(self.side_transform.spec, "the data module's side features")
        width = getattr(datamodule, "max_length", None)
        if width is not None and int(width) != int(self.hparams.max_length):  # the CLI links the two
            raise ValueError(
                f"the data module gives sessions of up to {width} items where the model reads {self.hparams.max_length}: "
                "build the task with max_length=datamodule.max_length"
            )
        distillation = self.hparams.get("distillation")
        if stage == "fit" and distillation is not None and self._teachers is None:
            if not hasattr(datamodule, "vocab"):
                raise ValueError("distillation checks its teachers against a SessionDataModule's vocabulary; pass datamodule=")
            self._teachers = Teachers(Distillation.of(distillation), datamodule.vocab, self.model.num_items,
                                      int(self.hparams.max_length))
        if stage == "fit" and self.loss.needs_item_counts and hasattr(datamodule, "vocab"):
            self.loss.set_item_counts(torch.from_numpy(datamodule.vocab.id_counts()))
        vectors = self.model.side_info.item_vectors if self.model.side_info is not None else None
        if stage == "fit" and vectors is not None:  # evaluation and scoring read them from the checkpoint
            for name, table in datamodule.item_vectors.items():
                vectors.set_vectors(name, torch.from_numpy(table))

    @property
    def uses_times(self) -> bool:
        """Whether the batches should carry event times: the encoder reads them, or a teacher's does while
        distilling (`SessionDataModule`'s ``times=None`` asks this when it builds its loaders)."""
        return self.model.uses_times or (self._teachers is not None and self._teachers.ensemble.uses_times)

    @property
    def needs_times(self) -> bool:
        """Whether the batches must carry event times: the model, or a teacher while distilling, was trained
        with them (`SessionModel.needs_times`)."""
        return self.model.needs_times or (self._teachers is not None and self._teachers.ensemble.needs_times)

    def schedule_clock(self) -> float:
        """Seconds of training so far, across resumes (what a `Schedule` with ``seconds`` decays on)."""
        return self._clock_before + (time.monotonic() - self._clock_start)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["sessrec"]["schedule_clock"] = self.schedule_clock()
        if self._teachers is not None:
            checkpoint["sessrec"]["teachers"] = self._teachers.hashes

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._clock_before = float(checkpoint.get("sessrec", {}).get("schedule_clock", 0.0))
        recorded = checkpoint.get("sessrec", {}).get("teachers")
        if recorded is not None and self._teachers is not None:  # a resumed distillation (setup loaded the teachers)
            self._teachers.check_resumed(recorded)

    def forward(self, batch: SessionBatch) -> torch.Tensor:
        return self.model(batch.items, self.objective, self.model.batch_features(batch))

    def _step(self, batch: SessionBatch, stage: str) -> torch.Tensor:
        features = self.model.batch_features(batch)  # side features, and event times for an encoder that reads them
        if stage == "train":
            gen = torch.Generator(device=batch.items.device).manual_seed(self.draw_seed())
            out = self.objective.training_output(self.model, batch.items, gen, features)
            if len(out.targets) and self._teachers is not None:
                loss, target, kl = self._teachers.loss(self.model, self.loss, out.hidden, out.targets, batch.items, batch, gen)
                self.log("train/target_loss", target, batch_size=len(batch))
                self.log("train/teacher_kl", kl, batch_size=len(batch))
            elif len(out.targets):
                loss = self.loss(self.model, out.hidden, out.targets, gen)
            else:  # a batch without targets gives 0, not NaN
                loss = out.hidden.sum() * 0.0
            if out.aux_loss is not None:
                loss = loss + out.aux_loss
            self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
            for name, value in out.logs.items():
                self.log(f"train/{name}", value, batch_size=len(batch))
            return loss
        scores = self.model(batch.items, self.objective, features)  # (B, V)
        known = self.model.targetable(batch.targets)
        losses = F.cross_entropy(scores[known], batch.targets[known], reduction="none")  # (known,)
        self.eval_loss[stage].update(losses)  # the mean over every known target of every process (NaN over none)
        self.log(f"{stage}/loss", self.eval_loss[stage], on_step=False, on_epoch=True)
        if self.evaluation.exclude_seen:
            scores = exclude_seen(scores, batch.items)
        self.metrics[stage].update(scores, batch.targets)
        return losses.mean() if known.any() else scores.new_zeros(())

    def draw_seed(self) -> int:
        """The seed of a training batch's draws (masking, negatives): `seed`, this process's rank and the batch's
        place in the run (each batch of an accumulated step its own; restored on a resume), mixed by the hash of
        a tuple of ints (the same in every process and run)."""
        batches = self.trainer.fit_loop.total_batch_idx if self._trainer is not None else 0
        return hash((self.hparams.seed, self.global_rank, batches))

    def _log_metrics(self, stage: str) -> None:
        values = self.metrics[stage].compute()
        self.log_dict({f"{stage}/{k}": v for k, v in values.items()}, prog_bar=False)
        self.metrics[stage].reset()
        if not self.trainer.sanity_checking:
            shown = " ".join(f"{k}={float(v):.4f}" for k, v in values.items())
            self.print(f"[{stage}] epoch {self.current_epoch} step {self.global_step}: {shown}")

    def recommend(self, items: torch.Tensor, k: int, features: dict[str, torch.Tensor] | None = None) -> TopK:
        """The `k` best recommendable items (fewer if the catalogue is smaller) of (B, L) model-id sessions."""
        scores = next_item_scores(self.model, self.objective, items, features, self.evaluation.exclude_seen)
        items, values = top_recommendable(scores, k, int(self.model.recommendable.sum()))
        return TopK(items=items, scores=values)

    # -- the artifact (`sessrec.artifacts.SessionRecommender`) ------------------------------------
    def inference(self) -> Inference:
        """What serving reads besides the weights: the session length, exclusion of seen items, top-k."""
        evaluation = self.evaluation
        return Inference(int(self.hparams.max_length), evaluation.exclude_seen, evaluation.top_k)

    def recommender(self) -> SessionRecommender:
        """The trained model as its artifact: the network and objective (the task's own, not copies),
        the data module's vocabulary and side-feature transforms, the inference settings of `evaluation`."""
        if self.vocab is None:
            raise ValueError("the task has no vocabulary: train it with a data module (sessrec fit)")
        return SessionRecommender(self.model, self.objective, self.vocab, self.inference(), self.side_transform,
                                  self.side_config)

    @classmethod
    def from_recommender(cls, recommender: SessionRecommender, **settings: Any) -> NextItemTask:
        """A task that trains on from a trained recommender (a warm start): its network's settings, its
        objective and weights, its inference settings as `evaluation`; `settings` give the rest (the
        loss, `optimization`, `schedule`, `seed`: a model directory holds no training settings).
        A network a NextItemTask does not build (one that reads another number of items than its
        inference settings) is refused in one line."""
        model, inference = recommender.model, recommender.inference
        args = config_of(model)["init_args"]
        if args["max_length"] != inference.max_length:
            raise ValueError(
                f"the network reads {args['max_length']} items and serving {inference.max_length}, where a "
                "NextItemTask serves the items its network reads: train on with the recipe instead"
            )
        init = {k: args[k] for k in ("num_items", "position_embedding", "dropout", "input_norm", "output_transform",
                                     "score_scale", "num_virtual")}
        init.update(encoder=args["encoder"], max_length=inference.max_length, objective=config_of(recommender.objective),
                    evaluation=Evaluation(top_k=inference.top_k, exclude_seen=inference.exclude_seen))
        if args.get("side_info") is not None:
            side = args["side_info"]["init_args"]
            init.update(side_features=side["spec"]["init_args"], side_info=side["config"])
        task = cls(**{**init, **settings})
        task.model.load_state_dict(model.state_dict())
        if isinstance(task.objective, nn.Module):
            task.objective.load_state_dict(recommender.objective.state_dict())
        task.vocab, task.side_transform, task.side_config = (recommender.vocab, recommender.side_transform,
                                                             recommender.side_features)
        return task

    def predict_step(self, batch: SessionBatch, batch_idx: int) -> TopK:
        with full_precision(self):
            return self.recommend(batch.items, self.evaluation.top_k, self.model.batch_features(batch))  # duck-typed batches too

    def configure_optimizers(self):
        optimization, schedule = self.optimization, self.schedule
        decay, rest = decayed_and_rest(self)
        opt = adamw(
            [{"params": decay, "weight_decay": optimization.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=optimization.lr,
        )
        self._clock_start = time.monotonic()  # just before the first step
        planned: list[float] = []

        def total() -> float:
            # read at the first decaying step, not here: asking the trainer now would build the training
            # loader before a resumed run has restored its position in the epoch; infinite for a run of no
            # planned end (max_epochs -1), which sessrec fit allows only with a constant decay or `seconds`
            if not planned:
                planned.append(max(self.trainer.estimated_stepping_batches, 1) if self._trainer is not None else 1)
            return planned[0]

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: schedule.factor(step, total, self.schedule_clock()))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
