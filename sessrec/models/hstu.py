"""HSTU encoder (Zhai et al., "Actions Speak Louder than Words", ICML 2024): pointwise aggregated attention.

Each layer of the hierarchical sequential transduction unit maps (B, L, D) to (B, L, D) with H heads
of width E = D / H:

    U, V, Q, K = split(SiLU(f1(LayerNorm(X))))                      # four (B, L, D)
    A[i, j]    = SiLU(Q_i . K_j + rab[i, j]) / n_i   for allowed j    # (B, H, L, L), 0 elsewhere
    Y          = f2(LayerNorm(A V) * U) + X

- **Pointwise attention**: a SiLU of each score instead of a softmax over the row, so the weights
  do not sum to one and keep how strongly the history as a whole bears on the next item.
- **Normalised by the sequence length**: n_i is the number of real items position i reads (itself
  and the real items before it). At the last item, the one read for the next item, that is the
  session's length n. Every earlier position is divided by the length of the prefix it has read,
  not by the whole session's: the whole session's length would tell position i how many items
  follow it, which a causal model must not know (`SessionModel`'s positions follow the same rule).
- **Relative attention bias** rab[i, j] = P[bucket(i - j)] + T[bucket(t_i - t_j)] per head: P on
  the distance between the two items, exact up to `num_position_buckets / 2` and log-spaced up to
  `max_distance` (T5's buckets); T on the log2 of their time difference in seconds, where the
  encoder is given event times (``times``; without them the time term is off). Both tables start
  at zero. The time of position i is its own event's, never the next one's: the next event's time
  would tell a position when the item it predicts happened.
- Causal: position i attends to the real positions j <= i.

Right-aligned sessions, two paths with equal results on the real positions:

- **Jagged** (the default on the CPU in eager mode): the real items of the batch are gathered into one (T, D)
  matrix, session after session; the projections, norms and f2 run on those T tokens only. For the
  attention the sessions are grouped by length (1, 2, 3-4, 5-8, ... items), each group left-aligned
  to its longest session: every query reads the items of its own session up to itself
  (block-diagonal causal attention by session), at a cost that follows the sessions' lengths rather
  than the padded width, in dense blocks (gathering each token's keys one by one costs more on a CPU
  than the padded attention it saves). The result is scattered back to the right-aligned layout.
- **Padded**: the (B, L, L) form with a mask. The default on an accelerator, where its few large
  kernels beat the jagged path's many small ones; used when the model is traced, compiled or exported
  (the jagged path's shapes depend on the data), or with ``jagged=False``. One training step at
  d_model 64-128, 2 layers, lengths 2..50: jagged 1.11x faster on one CPU thread, 2.2x slower on an
  H100 (`benchmarks/train_throughput.py --encoders hstu hstu_padded`, `benchmarks/gpu_suite.py`).

Padding positions come back as zeros. No softmax means no empty row to guard against: a padding
row's weights are all zero, never NaN, and real rows never read padding, so their outputs do not
depend on how much of it there is.

Event times: an encoder whose ``uses_times`` is true is called by `SessionModel` with a ``times``
keyword, (B, L) seconds aligned with the items (`SessionModel.encode`), or None. The encoder records
whether it was trained with them (`HSTUEncoder.trained_with_times`, set by its first forward in training
mode, saved with its weights): one trained with times refuses to be read without them (the time term off
would be another model's answer); one trained without them ignores times it is given (its time table was
never trained, and its ``uses_times`` is false, so that nothing passes them); one not yet trained reads
what it is given.

Shape letters: B batch, L sequence, D model width, H heads, E head width (D / H), T real items of
the batch, Bg / Wg sessions and width of a length group, Kp / Kt position and time buckets.

Examples:
    >>> enc = HSTUEncoder(d_model=16, n_head=2, n_layer=1)
    >>> x, real = torch.randn(2, 5, 16), torch.tensor([[False, False, True, True, True], [True] * 5])
    >>> enc(x, real).shape
    torch.Size([2, 5, 16])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from sessrec.models.hf_encoder import check_encoder, symbolic
from sessrec.models.sasrec import init_linear_layers
from sessrec.saved.registry import Configurable


def position_buckets(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Distances >= 0 -> bucket ids: exact below ``num_buckets // 2``, then log-spaced up to `max_distance`."""
    exact = num_buckets // 2
    far = distance.clamp(min=exact).to(torch.float32)
    log_bucket = exact + (torch.log(far / exact) / math.log(max_distance / exact) * (num_buckets - exact)).long()
    return torch.where(distance < exact, distance, log_bucket.clamp(max=num_buckets - 1))


def time_buckets(seconds: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Time differences in seconds -> bucket ids ``floor(log2(max(|dt|, 1)))``, capped at ``num_buckets - 1``
    (a difference that is no number, as padding's may be, gets a bucket in range, never read). The floor of log2
    is corrected to the power of two at or below the difference: ONNX Runtime's Log2 (log x / log 2) comes out just
    below the integer at a whole power of two (a gap of 2, 4, 256 s), which would read the bucket below."""
    dt = seconds.abs().clamp(min=1.0)
    bucket = torch.log2(dt).floor()
    bucket = bucket + (torch.exp2(bucket + 1) <= dt).to(bucket.dtype) - (torch.exp2(bucket) > dt).to(bucket.dtype)
    return bucket.long().clamp(min=0, max=num_buckets - 1)


class HSTULayer(nn.Module):
    """One HSTU layer: gated pointwise attention with relative position and time biases.

    The layer's parts are applied by `HSTUEncoder` in its padded and jagged layouts: `project`
    (the four projections), `bias` (rab from bucket ids) and `output` (gate, f2, residual).
    """

    def __init__(
        self, d_model: int, n_head: int, dropout: float, num_position_buckets: int, num_time_buckets: int, eps: float
    ) -> None:
        super().__init__()
        self.n_head = n_head
        self.input_norm = nn.LayerNorm(d_model, eps=eps)
        self.f1 = nn.Linear(d_model, 4 * d_model)  # U, V, Q, K
        self.attention_norm = nn.LayerNorm(d_model, eps=eps)
        self.f2 = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.position_bias = nn.Parameter(torch.zeros(num_position_buckets, n_head))  # P, (Kp, H)
        self.time_bias = nn.Parameter(torch.zeros(num_time_buckets, n_head))  # T, (Kt, H)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(..., D) -> U, V, Q, K, each (..., D): split(SiLU(f1(LayerNorm(x))))."""
        u, v, q, k = F.silu(self.f1(self.input_norm(x))).chunk(4, dim=-1)
        return u, v, q, k

    def bias(self, position: torch.Tensor, time: torch.Tensor | None) -> torch.Tensor:
        """Bucket ids (...,) of the position (and time) differences -> rab, (..., H)."""
        rab = self.position_bias[position]
        return rab if time is None else rab + self.time_bias[time]

    def output(self, attended: torch.Tensor, u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """A V (..., D), U and the input X -> f2(LayerNorm(A V) * U) + X."""
        return x + self.f2(self.dropout(self.attention_norm(attended) * u))


class HSTUEncoder(nn.Module, Configurable):
    """Causal HSTU stack mapping (B, L, D) embeddings to (B, L, D) hidden states (see the module docstring).

    Args:
        d_model: model width D.
        n_head: attention heads; must divide `d_model`.
        n_layer: HSTU layers.
        dropout: dropout on the gated attention output, before f2.
        num_position_buckets: buckets of the relative position bias (at least 2).
        max_distance: distance at which the position buckets end (longer ones share the last).
        num_time_buckets: buckets of the relative time bias, log2 of seconds (32 reach 68 years).
        layer_norm_eps: LayerNorm epsilon.
        jagged: compute over the real items only, in eager mode (the padded path when traced,
            compiled or exported, or with False); None: jagged on the CPU, padded on an
            accelerator. Both give the same outputs.
        initializer_range: std of the Linear weights (biases start at zero); default
            ``d_model ** -0.5``, as `SASRecEncoder`.

    A final LayerNorm follows the last layer, as in `SASRecEncoder`. ``trained_with_times`` says whether it was
    trained with event times (None before training; see the module docstring), saved with the weights.
    """

    causal: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int = 64,
        n_head: int = 2,
        n_layer: int = 2,
        dropout: float = 0.2,
        num_position_buckets: int = 32,
        max_distance: int = 128,
        num_time_buckets: int = 32,
        layer_norm_eps: float = 1e-6,
        jagged: bool | None = None,
        initializer_range: float | None = None,
    ) -> None:
        super().__init__()
        check_encoder(type(self).__name__, d_model, n_head, n_layer, dropout, initializer_range=initializer_range)
        if num_position_buckets < 2 or max_distance <= num_position_buckets // 2 or num_time_buckets < 1:
            raise ValueError(
                "need num_position_buckets >= 2, max_distance > num_position_buckets // 2 and num_time_buckets >= 1, got "
                f"{num_position_buckets}, {max_distance}, {num_time_buckets}"
            )
        self.d_model, self.n_head, self.jagged = d_model, n_head, jagged
        self.num_position_buckets, self.max_distance, self.num_time_buckets = num_position_buckets, max_distance, num_time_buckets
        self.layers = nn.ModuleList(
            HSTULayer(d_model, n_head, dropout, num_position_buckets, num_time_buckets, layer_norm_eps) for _ in range(n_layer)
        )
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        init_linear_layers(self, d_model, initializer_range)
        # whether the training batches carried event times: None until the first forward in training mode
        self.trained_with_times: bool | None = None

    @property
    def uses_times(self) -> bool:
        """Whether `SessionModel` passes this encoder event times: unless it was trained without them."""
        return self.trained_with_times is not False

    def get_extra_state(self) -> torch.Tensor:
        """`trained_with_times` in the state dict (checkpoints, model directories): -1 not yet trained, 0 without times, 1 with."""
        return torch.tensor(-1 if self.trained_with_times is None else int(self.trained_with_times), dtype=torch.int8)

    def set_extra_state(self, state: torch.Tensor) -> None:
        value = int(state)
        if value not in (-1, 0, 1):
            raise ValueError(f"HSTUEncoder: the saved trained_with_times is {value}, not -1 (not yet trained), 0 or 1")
        self.trained_with_times = None if value < 0 else bool(value)

    def _times_read(self, times: torch.Tensor | None) -> torch.Tensor | None:
        """The times a forward reads: the first forward in training mode records whether they are given; a model
        trained with them refuses a forward without them (training on included), one trained without them reads
        none (see the module docstring)."""
        if self.training and self.trained_with_times is None:
            self.trained_with_times = times is not None
        if self.trained_with_times and times is None:
            raise ValueError("HSTUEncoder: this model was trained with event times and is given none: give the "
                             "sessions their times (a timestamp column of the data, 'times' of a served request, "
                             "SessionBatch.times)")
        return times if self.trained_with_times is not False else None

    def forward(
        self, embeddings: torch.Tensor, attention_mask: torch.Tensor, times: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L, D) embeddings, (B, L) bool mask of real positions and optional (B, L) event times
        in seconds -> (B, L, D), zeros at padding. A real item's time that is no finite number is a ValueError, and
        so are floating times of fewer bits than float64 beyond the whole seconds they hold exactly (float32: 2^24 s,
        about 194 days; epoch seconds in float32 are whole multiples of 128 s, their differences buckets apart). No
        times for a model trained with them is a ValueError too; times for one trained without them are not read
        (`trained_with_times`)."""
        if times is not None and times.shape != attention_mask.shape:
            raise ValueError(f"times has shape {tuple(times.shape)}, the sessions {tuple(attention_mask.shape)}")
        if not symbolic():
            times = self._times_read(times)
        if times is not None and not symbolic():
            bad = ~torch.isfinite(times) & attention_mask
            if bool(bad.any()):
                at = bad.nonzero()[0].tolist()
                raise ValueError(f"times: event time {times[tuple(at)].item()} at {at} of a real item is not a finite number")
            if times.is_floating_point() and times.dtype != torch.float64:
                exact = 2 / torch.finfo(times.dtype).eps  # whole seconds the dtype holds exactly
                largest = float(times.abs().masked_fill(~attention_mask, 0).max()) if times.numel() else 0.0
                if largest >= exact:
                    raise ValueError(f"times: {times.dtype} event times reach {largest:.0f} s, beyond the {exact:.0f} whole "
                                     "seconds it holds exactly: give float64 seconds (torch.float64)")
        jagged = embeddings.device.type == "cpu" if self.jagged is None else self.jagged
        if jagged and not symbolic():
            return self._jagged(embeddings, attention_mask, times)
        return self._padded(embeddings, attention_mask, times)

    def _padded(self, x: torch.Tensor, real: torch.Tensor, times: torch.Tensor | None) -> torch.Tensor:
        block = self._block(real, times)
        for layer in self.layers:
            u, v, q, k = layer.project(x)
            x = layer.output(self._attend(layer, block, q, k, v), u, x)
        return self.norm(x) * real[..., None].to(x.dtype)

    def _jagged(self, x: torch.Tensor, real: torch.Tensor, times: torch.Tensor | None) -> torch.Tensor:
        b, length, d = x.shape
        flat = real.reshape(-1).nonzero().squeeze(1)  # (T,) positions of the real items, session after session
        if len(flat) == 0:
            return x.new_zeros(b, length, d)
        tokens = x.reshape(b * length, d).index_select(0, flat)  # (T, D)
        stamps = None if times is None else torch.cat([times.reshape(-1)[flat], times.new_zeros(1)])  # (T + 1,)
        groups = self._groups(real.sum(dim=1), len(flat), stamps)
        # (Tg,) the real cells of each group's (Bg * Wg) grid, found once for every layer
        cells = [block.real.reshape(-1).nonzero().squeeze(1) for _, block in groups]
        order = torch.cat([slots.reshape(-1).index_select(0, c) for (slots, _), c in zip(groups, cells)])  # (T,)
        back = torch.argsort(order)  # (T,) row of each token
        for layer in self.layers:
            u, v, q, k = layer.project(tokens)
            qkv = torch.cat([torch.cat([q, k, v], dim=-1), tokens.new_zeros(1, 3 * d)])  # (T + 1, 3D); row T: padding
            rows = []
            for (slots, block), c in zip(groups, cells):
                gq, gk, gv = qkv[slots].split(d, dim=-1)  # (Bg, Wg, D) each
                rows.append(self._attend(layer, block, gq, gk, gv).reshape(-1, d).index_select(0, c))  # (Tg, D)
            tokens = layer.output(torch.cat(rows).index_select(0, back), u, tokens)
        out = x.new_zeros(b * length, d)
        out[flat] = self.norm(tokens)
        return out.view(b, length, d)

    def _groups(self, lengths: torch.Tensor, total: int, stamps: torch.Tensor | None) -> list[tuple[torch.Tensor, _Block]]:
        """Sessions grouped by length (1, 2, 3-4, 5-8, ... items), each group left-aligned to its longest session:
        ((Bg, Wg) token ids, T at padding; its `_Block`) per group. Sessions without items are left out."""
        starts = lengths.cumsum(0) - lengths  # (B,) first token of each session
        group = torch.ceil(torch.log2(lengths.clamp(min=1).to(torch.float32))).long().masked_fill(lengths == 0, -1)
        out = []
        for g in torch.unique(group).tolist():
            if g < 0:
                continue
            members = (group == g).nonzero().squeeze(1)
            width = int(lengths[members].max())
            offsets = torch.arange(width, device=lengths.device)
            real = offsets[None, :] < lengths[members, None]  # (Bg, Wg)
            slots = torch.where(real, starts[members, None] + offsets[None, :], total)  # (Bg, Wg)
            out.append((slots, self._block(real, None if stamps is None else stamps[slots])))
        return out

    def _block(self, real: torch.Tensor, times: torch.Tensor | None) -> _Block:
        """What the attention of a (B, L) block of sessions needs besides the projections: the same for every layer."""
        at = torch.arange(real.shape[1], device=real.device)
        distance = at[:, None] - at[None, :]  # (L, L): i - j, >= 0 where allowed
        allowed = (distance >= 0) & real[:, :, None] & real[:, None, :]  # (B, L, L)
        count = real.cumsum(dim=1).clamp(min=1)  # (B, L): n_i, the real items position i reads
        position = position_buckets(distance.clamp(min=0), self.num_position_buckets, self.max_distance)  # (L, L)
        time = None if times is None else time_buckets(times[:, :, None] - times[:, None, :], self.num_time_buckets)
        return _Block(real, allowed / count[:, :, None], position, time)

    def _attend(self, layer: HSTULayer, block: _Block, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Q, K, V (B, L, D) of a block -> A V, (B, L, D): A = SiLU(Q K^T + rab) / n_i on the allowed pairs."""
        b, length, d = q.shape
        h, e = self.n_head, d // self.n_head
        scores = torch.einsum("bihe,bjhe->bhij", q.view(b, length, h, e), k.view(b, length, h, e))
        scores = scores + layer.bias(block.position, block.time).movedim(-1, -3)  # rab (H, L, L) or (B, H, L, L)
        weights = F.silu(scores) * block.scale[:, None].to(scores.dtype)  # (B, H, L, L)
        return torch.einsum("bhij,bjhe->bihe", weights, v.view(b, length, h, e)).reshape(b, length, d)


@dataclass
class _Block:
    """A (B, L) block of sessions as the attention reads it.

    Args:
        real: (B, L) bool real positions.
        scale: (B, L, L) 1 / n_i where query i may read key j (causal, both real), else 0.
        position: (L, L) bucket of the distance i - j.
        time: (B, L, L) bucket of the time difference t_i - t_j, or None without times.
    """

    real: torch.Tensor
    scale: torch.Tensor
    position: torch.Tensor
    time: torch.Tensor | None
