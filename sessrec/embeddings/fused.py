"""Fused embedding tables: `FusedEmbeddingBagCollection`, with an optional fused sparse optimizer.

Tables whose stored (padded) width is the same share one weight tensor; each table owns a
contiguous block of its rows (a row offset). A batch of `SparseFeatures` is looked up with one
`embedding_bag` call per width group: the ids of every feature in the group are shifted by their
table's row offset and pooled by sum over bags given by offsets (mean = sum / bag length; an empty
bag gives zeros).

Stored widths are padded to a multiple of ``pad_to_bytes`` bytes (16 by default) so every row
starts on an aligned address; the padding columns stay zero and outputs are sliced back to each
table's width.

With ``optimizer="sgd"`` or ``"adagrad_rowwise"`` the backward pass updates the touched rows in
place (the idea of FBGEMM's table-batched embeddings): no gradient the size of a table is ever
built, and the weights are buffers that an outer optimizer never sees. With ``"none"`` each group's
weight is an ordinary dense `nn.Parameter` for any torch optimizer.

Shape letters: F features, B batch, T ids in the batch, D table width, P padded width,
R rows of a width group, U distinct rows touched.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from sessrec.embeddings.config import TableConfig
from sessrec.embeddings.host_memory import advise_huge_pages
from sessrec.embeddings.jagged import SparseFeatures
from sessrec.embeddings.kernels import sgd_scatter

OPTIMIZERS = ("none", "sgd", "adagrad_rowwise")
# pooled output per lookup call on CPU: fewer calls than one per feature (each call and its offsets
# cost a few ops), never one block the size of the batch (a block over 32 MB is always a fresh mmap)
_CPU_LOOKUP_CHUNK_BYTES = 4 * 2**20


def padded_width(dim: int, pad_to_bytes: int | None, element_size: int = 4) -> int:
    """``dim`` rounded up so a row is a multiple of ``pad_to_bytes`` bytes (0 or None: unchanged)."""
    if not pad_to_bytes:
        return dim
    if pad_to_bytes < 0 or pad_to_bytes % element_size:
        raise ValueError(f"pad_to_bytes must be a non-negative multiple of {element_size} bytes, got {pad_to_bytes}")
    step = pad_to_bytes // element_size
    return -(-dim // step) * step


def seeded_generator(seed: int | None, device: torch.device | str | None = None) -> torch.Generator:
    """A generator on `device` (None: the CPU) seeded with `seed`, or from the system's entropy when None."""
    generator = torch.Generator(device=device or "cpu")
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def flat_bags(
    ids: torch.Tensor, offsets: torch.Tensor | None, per_sample_weights: torch.Tensor | None, what: str = "ids"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`nn.EmbeddingBag`'s inputs, (B, k) `ids` one bag per row or (T,) `ids` with (B,) bag starts, as (T,)
    ids, (B + 1,) offsets ending at T, and (T,) weights (or None); a layout that is neither is refused."""
    if ids.dim() == 2:
        if offsets is not None:
            raise ValueError(f"offsets are only for 1-D {what}")
        offsets = torch.arange(0, ids.numel(), max(ids.shape[1], 1), device=ids.device)[: ids.shape[0]]
        ids = ids.reshape(-1)
        per_sample_weights = None if per_sample_weights is None else per_sample_weights.reshape(-1)
    elif ids.dim() != 1 or offsets is None:
        raise ValueError(f"{what} must be (B, k), or (T,) with offsets; got shape {tuple(ids.shape)}, offsets {offsets}")
    offsets = torch.cat([offsets, offsets.new_tensor([ids.numel()])])  # (B + 1,)
    if bool((offsets.diff() < 0).any()) or int(offsets[0]) != 0:
        raise ValueError("offsets must start at 0 and be non-decreasing")
    return ids, offsets, per_sample_weights


def _row_writer(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` viewed with 16-byte elements (complex128) when its rows allow, else itself.

    `index_copy_` copies element by element, so 16-byte elements write a 64-float row in 16 steps
    instead of 64, a quarter of the per-element work; it is a copy, so the dtype is irrelevant.
    """
    row_bytes = weight.shape[1] * weight.element_size()
    if (weight.dim() == 2 and weight.stride(1) == 1 and weight.stride(0) == weight.shape[1] and not row_bytes % 16
            and not (weight.storage_offset() * weight.element_size()) % 16 and weight.dtype != torch.complex128):
        return weight.view(torch.complex128)
    return weight


def _bag_sum(
    weight: torch.Tensor, input: torch.Tensor, offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False, sparse: bool = False,
) -> torch.Tensor:
    """Sum-pooled `embedding_bag` called directly: ``F.embedding_bag``'s Python argument checks cost
    more than the lookup of a small chunk, and every caller here passes checked arguments. ``sparse``:
    the weight's gradient is a sparse tensor of the rows looked up."""
    return torch.embedding_bag(weight, input, offsets, False, 0, sparse, per_sample_weights, include_last_offset)[0]


def sparse_update(
    weight: torch.Tensor, momentum: torch.Tensor | None, rows: torch.Tensor, grad: torch.Tensor,
    optimizer: str, lr: float, eps: float, row_dim: torch.Tensor | float,
    bags: torch.Tensor | None = None, per_sample_weights: torch.Tensor | None = None,
    chunk_bytes: int | None = None, blocks: Sequence[tuple[int, int, torch.Tensor]] | None = None,
    compiled: bool = False,
) -> None:
    """Apply SGD or row-wise Adagrad in place to the rows touched by one batch.

    With ``compiled`` (SGD on CPU, one gradient tensor, deterministic algorithms not requested) the
    update is the TorchInductor-compiled scatter of `sessrec.embeddings.kernels`, when it compiles
    here; otherwise the sorted update below.

    The ids are sorted (as int32 when the weight has fewer than 2^31 rows: a faster sort), so the
    occurrences of each distinct row are adjacent. The distinct rows are then processed in chunks of
    about ``chunk_bytes`` of rows (1 MB by default on CPU, all at once on other devices): the gradient
    of each row is summed over its occurrences by one sum-pooled `embedding_bag` over the gradient
    rows, the current rows are gathered by another (it prefetches, unlike `index_select`), updated in
    place, and written back once with `index_copy_`. Chunks keep every temporary small enough to stay
    in the cache between its gather and its write and to be recycled by the allocator, instead of
    fresh multi-MB buffers that cost page faults on every step; duplicates accumulate, and each
    touched row is read and written once.

    Args:
        weight: (R, P) weights, updated in place.
        momentum: (R,) row-wise Adagrad state (the sum over steps of the mean squared gradient of
            the row), updated in place; unused by SGD.
        rows: (T,) row of each id, duplicates allowed.
        grad: (T, P) gradient of each id occurrence, or (bags, P) per bag when ``bags`` is given.
        optimizer: ``sgd`` or ``adagrad_rowwise``.
        row_dim: the true width D that the mean squared gradient divides by (padding columns carry
            zero gradient): a float, or a (R,) tensor when widths differ inside the weight.
        bags: optional (T,) bag of each id: occurrence t takes gradient ``grad[bags[t]]``.
        per_sample_weights: optional (T,) weight of each id occurrence (scales its gradient).
        chunk_bytes: bytes of rows per chunk; None: 1 MB on CPU, unchunked elsewhere.
        blocks: the gradient in pieces instead of ``grad`` (pass ``grad=None``), so that per-feature
            gradients need not be stacked into one tensor: ``(first_row, first_bag, block)`` in
            increasing ``first_row``, where the rows from ``first_row`` up to the next block's take
            their gradients from ``block[bag - first_bag]``; the first block starts at row 0. Chunks
            never straddle two blocks.
        compiled: use the compiled scatter for SGD where it applies.
    """
    if rows.numel() == 0:
        return
    if (compiled and optimizer == "sgd" and blocks is None and weight.device.type == "cpu"
            and not torch.are_deterministic_algorithms_enabled()):
        kernel = sgd_scatter(weight.shape[1], weight.dtype, bags is not None, per_sample_weights is not None)
        if kernel is not None:
            kernel(weight, rows, grad, bags, per_sample_weights, lr)
            return
    keys = rows.to(torch.int32) if weight.shape[0] < 2**31 else rows
    sorted_rows, order = keys.sort()
    unique, counts = torch.unique_consecutive(sorted_rows, return_counts=True)  # (U,), (U,)
    unique = unique.long()
    ends = counts.cumsum(0)  # (U,) end of each distinct row's occurrences in sorted order
    source = order if bags is None else bags[order]  # (T,) gradient row of each sorted occurrence
    psw = None if per_sample_weights is None else per_sample_weights[order]
    writer = _row_writer(weight)
    n = unique.numel()
    if chunk_bytes is None:
        chunk_bytes = 2**20 if weight.device.type == "cpu" else None
    step = n if chunk_bytes is None else max(256, chunk_bytes // (weight.shape[1] * weight.element_size()))
    if blocks is None:
        blocks = [(0, 0, grad)]
    cuts = [0, n]
    if len(blocks) > 1:  # first distinct row of each block
        first_rows = torch.tensor([b[0] for b in blocks[1:]], dtype=unique.dtype, device=unique.device)
        cuts = [0, *torch.searchsorted(unique, first_rows).tolist(), n]
    chunks = [(lo, min(lo + step, cuts[k + 1]), k) for k in range(len(blocks)) for lo in range(cuts[k], cuts[k + 1], step)]
    if not chunks:
        return
    begins = ends - counts  # (U,) first sorted occurrence of each distinct row
    los = torch.tensor([c[0] for c in chunks], device=unique.device)
    bounds = torch.cat([begins[los], ends[-1:]]).tolist()  # occurrence range of each chunk; one sync
    positions = torch.arange(min(step, n), device=weight.device)  # (C,) one row per bag
    for c, (lo, hi, k) in enumerate(chunks):
        first, last = bounds[c], bounds[c + 1]
        _, first_bag, block = blocks[k]  # contiguous: the backward passes only contiguous blocks
        bag = source[first:last] if not first_bag else source[first:last] - first_bag  # (occurrences,) rows of block
        summed = _bag_sum(block, bag, begins[lo:hi] - first, None if psw is None else psw[first:last])  # (C, P)
        u = unique[lo:hi]
        new = _bag_sum(weight, u, positions[:hi - lo])  # (C, P) current rows
        if optimizer == "sgd":
            new.add_(summed, alpha=-lr)
        else:
            dims = row_dim[u] if isinstance(row_dim, torch.Tensor) else row_dim
            state = momentum.index_select(0, u).add_(summed.pow(2).sum(1).div_(dims))  # (C,)
            momentum.index_copy_(0, u, state)
            new.addcmul_(summed, (state.sqrt_().add_(eps)).reciprocal_().unsqueeze(1), value=-lr)
        writer.index_copy_(0, u, new.view(writer.dtype))


def _lookup_chunks(
    weight: torch.Tensor, chunks: list[tuple[torch.Tensor, torch.Tensor]], per_sample_weights: torch.Tensor | None,
    batch: int, dims: list[int], sparse: bool = False,
) -> list[torch.Tensor]:
    """Sum-pooled lookups of ``(rows, offsets)`` chunks of whole features: one (B, D) output per feature.

    Each chunk's output is split with `unbind`, not ``out[j]``: under autograd that is one backward
    node stacking the chunk's gradients, not one zero-filled (F_c, B, P) gradient per feature.
    ``dims`` are the features' true widths: a padded output is a view of its first D columns.
    ``sparse``: the weight's gradient is a sparse tensor of the rows looked up.
    """
    outputs, start = [], 0
    for rows, offsets in chunks:
        psw = None if per_sample_weights is None else per_sample_weights[start:start + rows.numel()]
        out = _bag_sum(weight, rows, offsets, psw, include_last_offset=True, sparse=sparse)
        outputs.extend(out.view(-1, batch, out.shape[1]).unbind(0))  # (B, P) per feature of the chunk
        start += rows.numel()
    width = weight.shape[1]
    return [o if d == width else o[:, :d] for o, d in zip(outputs, dims)]


class _FusedLookup(torch.autograd.Function):
    """Sum-pooled `embedding_bag` whose backward updates the weight rows instead of returning a gradient.

    ``anchor`` is an empty tensor that requires grad, so autograd calls backward although the
    weight itself does not require grad.
    """

    @staticmethod
    def forward(ctx, anchor, weight, state, rows, offsets, per_sample_weights, optimizer, lr, eps, row_dim, compiled):
        ctx.state = state  # () -> (weight, momentum) at backward time (a dynamic table may have grown)
        ctx.optimizer, ctx.lr, ctx.eps, ctx.row_dim, ctx.compiled = optimizer, lr, eps, row_dim, compiled
        ctx.save_for_backward(rows, offsets, per_sample_weights)
        return F.embedding_bag(
            rows, weight, offsets, mode="sum", per_sample_weights=per_sample_weights, include_last_offset=True
        )

    @staticmethod
    def backward(ctx, grad):  # grad: (bags, P)
        rows, offsets, psw = ctx.saved_tensors
        n = grad.shape[0]
        one_per_bag = rows.numel() == n and bool((offsets.diff() == 1).all())
        bags = None if one_per_bag else torch.repeat_interleave(
            torch.arange(n, device=grad.device), offsets.diff(), output_size=rows.numel()
        )  # (T,) bag of each id; None: id t is bag t
        with torch.no_grad():
            weight, momentum = ctx.state()
            sparse_update(weight, momentum, rows, grad.contiguous(), ctx.optimizer, ctx.lr, ctx.eps,
                          ctx.row_dim, bags, psw, compiled=ctx.compiled)
        return (None,) * 11


class _FusedFeatureLookup(torch.autograd.Function):
    """`_FusedLookup` for a width group: one (B, D) output per feature, one gradient per feature.

    The lookup runs over ``chunks`` of whole features, ``(rows slice, offsets)`` each (offsets with
    the total at the end), so no buffer the size of the whole batch's output is allocated. ``rows``
    (T_g,) is the whole group's, kept for backward.

    Backward: with the compiled SGD update (``compiled``), or when some feature's gradient must be
    copied anyway (a broadcast, a slice of a stacked gradient), the gradients are stacked once into
    (F_g·B, P) in bag order. Otherwise the sorted update reads each feature's gradient where it is:
    ``units`` lists ``(first_row, first_feature, end_feature)`` per table in row order (a table's
    features are adjacent), and only the features of a table that several features share are
    concatenated. ``lengths`` (F_g·B,) and ``per_sample_weights`` (T_g,) cover the whole group.
    """

    @staticmethod
    def forward(ctx, anchor, weight, state, rows, chunks, lengths, per_sample_weights, optimizer, lr, eps, row_dim,
                units, batch, dims, compiled):
        ctx.set_materialize_grads(False)  # an unused feature's gradient stays None, not a zero block
        ctx.state, ctx.units, ctx.batch, ctx.rows, ctx.dims = state, units, batch, rows, dims  # rows: our own tensor
        ctx.optimizer, ctx.lr, ctx.eps, ctx.row_dim, ctx.compiled = optimizer, lr, eps, row_dim, compiled
        ctx.save_for_backward(lengths, per_sample_weights)
        return tuple(_lookup_chunks(weight, chunks, per_sample_weights, batch, dims))

    @staticmethod
    def backward(ctx, *grads):  # F_g x (B, D) or None
        if all(g is None for g in grads):
            return (None,) * 16
        lengths, psw = ctx.saved_tensors
        weight, momentum = ctx.state()
        rows = ctx.rows  # (T_g,)
        n = lengths.numel()
        one_per_bag = rows.numel() == n and bool((lengths == 1).all())
        bags = None if one_per_bag else torch.repeat_interleave(
            torch.arange(n, device=rows.device), lengths, output_size=rows.numel()
        )  # (T,) bag of each id; None: id t is bag t
        width, b = weight.shape[1], ctx.batch
        grad, blocks = None, None
        if any(d < width for d in ctx.dims):  # padded features: one (F_g·B, P) gradient, padding columns zero
            grad = weight.new_empty(len(grads) * b, width)
            for j, (g, d) in enumerate(zip(grads, ctx.dims)):
                block = grad[j * b:(j + 1) * b]
                if g is None:
                    block.zero_()
                else:
                    block[:, :d].copy_(g)
                    block[:, d:].zero_()
        else:
            zero = weight.new_zeros(1, width).expand(b, -1)  # (B, P) for unused features
            parts = [zero if g is None else g for g in grads]
            if ctx.compiled or not all(g.is_contiguous() for g in parts):
                # one gradient, one copy: the compiled update takes a single tensor, and a broadcast or a
                # slice of a stacked gradient would be copied anyway
                grad = parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)  # (F_g·B, P), bag order
            else:  # read each feature's gradient where it is
                blocks = [(first_row, lo * b, parts[lo] if hi == lo + 1 else torch.cat(parts[lo:hi]))
                          for first_row, lo, hi in ctx.units]
        with torch.no_grad():
            sparse_update(weight, momentum, rows, grad, ctx.optimizer, ctx.lr, ctx.eps, ctx.row_dim, bags, psw,
                          blocks=blocks, compiled=ctx.compiled)
        return (None,) * 16


class FusedEmbeddingBagCollection(nn.Module):
    """Several embedding tables looked up with one `embedding_bag` call per stored width.

    Args:
        tables: the table configs; names and feature names must be unique across tables.
        pad_to_bytes: stored rows are padded to a multiple of this many bytes (0 or None: no padding).
        optimizer: ``none`` (weights are dense `nn.Parameter`s for any optimizer), ``sgd`` or
            ``adagrad_rowwise`` (rows updated in place during backward; weights are buffers).
        sparse_gradient: with ``none``, the weights' gradients are sparse tensors of the rows a batch
            looked up (for ``torch.optim.SparseAdam``, `torch.optim.SGD` or Adagrad): no gradient the
            size of a table per step, and an optimizer that touches those rows only.
        lr: learning rate of the fused optimizer (an attribute, so a schedule may change it).
        eps: row-wise Adagrad's epsilon.
        device: where the weights live (default: the current default device).
        seed: seeds the initial weights (uniform in +-sqrt(1 / num_embeddings) per table, as
            TorchRec); None draws from torch's global generator.
        huge_pages: on Linux CPUs, ask for 2 MB pages for the weights and the Adagrad state
            (`advise_huge_pages`): fewer TLB misses on scattered rows. No effect elsewhere.
        compile_update: with ``sgd`` on CPU, apply the update as one TorchInductor-compiled
            scatter-add loop (`sessrec.embeddings.kernels`: no sort, one pass over the ids, so
            cheaper than the sorted eager update) when it compiles here; False, under
            ``torch.use_deterministic_algorithms``, or without a C++ compiler: the sorted eager update.
            The two differ only in the order in which duplicate ids' gradients are added.

    Training on CPU, call `sessrec.embeddings.retain_freed_memory()` once (``DLRMTask`` does with
    ``retain_freed_memory: true``; it is process-wide, so nothing calls it unasked): with
    glibc's default trimming each step page-faults its outputs and gradients back in, which costs
    much of the fused step's lead over separate bags (``docs/benchmarks.md``, Embedding core).

    Examples:
        >>> ebc = FusedEmbeddingBagCollection([TableConfig("city", 100, 8), TableConfig("tags", 50, 8, "mean")], seed=0)
        >>> out = ebc(SparseFeatures.from_dense({"city": torch.tensor([3, 1]), "tags": torch.tensor([[2, 5], [4, -1]])}))
        >>> out["tags"].shape
        torch.Size([2, 8])
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        pad_to_bytes: int | None = 16,
        optimizer: Literal["none", "sgd", "adagrad_rowwise"] = "none",
        sparse_gradient: bool = False,
        lr: float = 0.01,
        eps: float = 1e-8,
        device: torch.device | str | None = None,
        seed: int | None = None,
        huge_pages: bool = True,
        compile_update: bool = True,
    ) -> None:
        super().__init__()
        tables = tuple(tables)
        if not tables or not all(isinstance(t, TableConfig) for t in tables):
            raise TypeError(f"tables must be a non-empty sequence of TableConfig, got {tables!r}")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        features = [f for t in tables for f in t.features]
        if len(set(features)) != len(features):
            dup = sorted({f for f in features if features.count(f) > 1})
            raise ValueError(f"each feature is looked up in one table; {dup} appear in several")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if sparse_gradient and optimizer != "none":
            raise ValueError(f"sparse_gradient is for tables updated by an outer optimizer (optimizer 'none'), got {optimizer!r}")
        if not lr > 0 or not eps > 0:
            raise ValueError(f"lr and eps must be > 0, got lr={lr}, eps={eps}")
        self.tables = tables
        self.optimizer, self.lr, self.eps, self.pad_to_bytes = optimizer, lr, eps, pad_to_bytes
        self.compile_update, self.sparse_gradient = compile_update, sparse_gradient
        generator = seeded_generator(seed, device)

        # width groups in order of first appearance: padded width -> table indices
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(tables):
            groups.setdefault(padded_width(t.embedding_dim, pad_to_bytes), []).append(i)
        self.widths = tuple(groups)
        self._table_group: dict[str, tuple[int, int]] = {}  # table -> (group, first row)
        self._group_features: list[list[str]] = []
        self._group_units: list[list[tuple[int, int, int]]] = []  # per group: (first row, features lo, hi) per table
        self._feature_table: dict[str, TableConfig] = {f: t for t in tables for f in t.features}
        self.feature_names = tuple(features)
        for g, (width, members) in enumerate(groups.items()):
            rows = sum(tables[i].num_embeddings for i in members)
            weight = torch.empty(rows, width, device=device)  # (R, P); padding columns stay 0
            if huge_pages:
                advise_huge_pages(weight)  # before the first write, which picks the pages
            weight.zero_()
            starts, dims, feats, offs, ends, units = [], [], [], [], [], []
            start = 0
            for i in members:
                t = tables[i]
                units.append((start, len(feats), len(feats) + len(t.features)))  # rows from `start`: these features
                bound = math.sqrt(1.0 / t.num_embeddings)
                weight[start:start + t.num_embeddings, :t.embedding_dim].uniform_(-bound, bound, generator=generator)
                self._table_group[t.name] = (g, start)
                starts.append(start)
                dims.append(float(t.embedding_dim))
                for f in t.features:
                    feats.append(f)
                    offs.append(start)
                    ends.append(start + t.num_embeddings)
                start += t.num_embeddings
            self._group_features.append(feats)
            self._group_units.append(units)
            if optimizer == "none":
                self.register_parameter(f"weight_{g}", nn.Parameter(weight))
            else:
                self.register_buffer(f"weight_{g}", weight)
            if optimizer == "adagrad_rowwise":
                momentum = torch.empty(rows, device=device)
                if huge_pages:
                    advise_huge_pages(momentum)
                self.register_buffer(f"momentum_{g}", momentum.zero_())
                if len(set(dims)) > 1:  # (R,) true width of each row: padding carries no gradient
                    counts = torch.tensor([tables[i].num_embeddings for i in members], device=device)
                    row_dim = torch.repeat_interleave(torch.tensor(dims, device=device), counts)
                    self.register_buffer(f"row_dim_{g}", row_dim, persistent=False)
            self.register_buffer(f"row_offset_{g}", torch.tensor(offs, device=device), persistent=False)  # (F_g,)
            self.register_buffer(f"row_end_{g}", torch.tensor(ends, device=device), persistent=False)  # (F_g,)
        if optimizer != "none":
            self._anchor = torch.zeros(0, device=device, requires_grad=True)  # makes autograd call backward

    def weight(self, group: int) -> torch.Tensor:
        """(R, P) the shared weight of width group ``group``."""
        return getattr(self, f"weight_{group}")

    def _state_of(self, group: int):
        """() -> (weight, momentum) of a width group, read when backward runs."""
        return lambda: (self.weight(group), getattr(self, f"momentum_{group}", None))

    def table_weight(self, name: str) -> torch.Tensor:
        """(num_embeddings, embedding_dim) view of table ``name``'s rows (without padding)."""
        table = next((t for t in self.tables if t.name == name), None)
        if table is None:
            raise KeyError(f"no table {name!r}; tables are {[t.name for t in self.tables]}")
        g, start = self._table_group[name]
        return self.weight(g)[start:start + table.num_embeddings, :table.embedding_dim]

    def _layout(self) -> list[list[Any]]:
        """``[name, rows, width]`` of every table in order: whose rows each block of the weights holds."""
        return [[t.name, t.num_embeddings, t.embedding_dim] for t in self.tables]

    def get_extra_state(self) -> torch.Tensor:
        """The tables' layout (`_layout` as UTF-8 JSON bytes) in the state dict: the weights are blocks of rows
        by position, so weights saved with the tables in another order or of other sizes are refused at load."""
        return torch.tensor(list(json.dumps(self._layout()).encode()), dtype=torch.uint8)

    def set_extra_state(self, state: torch.Tensor) -> None:
        saved, own = json.loads(bytes(state.tolist()).decode()), self._layout()
        if saved != own:
            i = next((i for i, (a, b) in enumerate(zip(saved, own)) if a != b), min(len(saved), len(own)))
            there, here = (x[i] if i < len(x) else "absent" for x in (saved, own))
            raise ValueError(
                f"the saved weights are of other tables: table {i} is {there} there and {here} here "
                "([name, rows, width]); build the collection with the tables, in the order, it was saved with"
            )

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        saved = state_dict.get(prefix + "_extra_state")
        if saved is not None:
            self.set_extra_state(saved)  # refused before any weight is copied
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, features: SparseFeatures) -> dict[str, torch.Tensor]:
        """Pooled embeddings: feature name -> (B, D), in the order of the table configs' features."""
        if not isinstance(features, SparseFeatures):
            raise TypeError(f"expected SparseFeatures, got {type(features).__name__}")
        keys = features.keys
        unknown = [k for k in keys if k not in self._feature_table]
        if unknown:
            raise ValueError(f"unknown feature keys {unknown}; this collection looks up {list(self.feature_names)}")
        missing = [f for f in self.feature_names if f not in keys]
        if missing:
            raise ValueError(f"features {missing} are missing from the batch (got {list(keys)})")
        b = features.batch_size
        position = {k: i for i, k in enumerate(keys)}
        counts = features.feature_lengths()  # (F,)
        starts = [0, *counts.cumsum(0).tolist()]  # one host sync for the whole batch
        pooled: dict[str, torch.Tensor] = {}
        for g, feats in enumerate(self._group_features):
            idx = [position[f] for f in feats]
            contiguous = idx == list(range(idx[0], idx[0] + len(idx)))
            if contiguous:  # the group's features are adjacent and in order: slices, no copies
                values = features.values[starts[idx[0]]:starts[idx[-1] + 1]]
                lengths = features.lengths[idx[0] * b:(idx[-1] + 1) * b]
                weights = None if features.weights is None else features.weights[starts[idx[0]]:starts[idx[-1] + 1]]
            else:
                values = torch.cat([features.values[starts[i]:starts[i + 1]] for i in idx])
                lengths = torch.cat([features.lengths[i * b:(i + 1) * b] for i in idx])
                weights = None if features.weights is None else torch.cat(
                    [features.weights[starts[i]:starts[i + 1]] for i in idx]
                )
            sizes = [starts[i + 1] - starts[i] for i in idx]  # ids per feature
            weight = self.weight(g)
            if weights is not None:
                weights = weights.to(weight.dtype)  # embedding_bag takes weights of the table's dtype only
            rows, chunks = self._chunks(g, values, lengths, sizes, feats, b)
            dims = [self._feature_table[f].embedding_dim for f in feats]
            if self.optimizer == "none":
                per_bag = _lookup_chunks(weight, chunks, weights, b, dims, self.sparse_gradient)  # F_g x (B, D)
            else:
                row_dim = getattr(self, f"row_dim_{g}", None)
                if row_dim is None:
                    row_dim = float(self._feature_table[feats[0]].embedding_dim)
                per_bag = _FusedFeatureLookup.apply(
                    self._anchor, weight, self._state_of(g), rows, chunks, lengths,
                    weights, self.optimizer, self.lr, self.eps, row_dim,
                    self._group_units[g], b, dims, self.compile_update,
                )  # F_g x (B, D)
            lengths = lengths.view(len(feats), b)
            for j, f in enumerate(feats):
                table = self._feature_table[f]
                x = per_bag[j]  # (B, D)
                if table.pooling == "mean":
                    x = x / lengths[j].clamp(min=1).unsqueeze(1).to(x.dtype)
                pooled[f] = x
        return {f: pooled[f] for f in self.feature_names}

    def _chunks(
        self, group: int, values: torch.Tensor, lengths: torch.Tensor, sizes: list[int], feats: list[str], batch: int,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The group's rows (T_g,), range-checked, and its lookup in chunks of whole features.

        ``rows`` is each id plus its table's first row in the group's weight, computed once for the
        group; each chunk is ``(rows slice, offsets)``, the offsets starting each bag, with the
        chunk's total at the end. On CPU a chunk holds as many features as fit about 4 MB of pooled
        output (at least one): fewer calls than one per feature, since every call costs a few small
        ops, but never a single (F_g·B, P) block (27 MB at batch 4096, 26 features, width 64), which
        glibc serves from a fresh mapping once it passes its 32 MB mmap threshold and which costs a
        page fault per 4 KB whenever it was handed back to the kernel. On other devices, where a call
        costs a launch, the group is one chunk.

        When every feature has the same number of ids (fixed hotness, the usual case) the ids are a
        (F_g, n) matrix: one broadcast add and one row-wise max for the range check, with no per-id
        offset or limit arrays.
        """
        first = getattr(self, f"row_offset_{group}")  # (F_g,)
        table_rows = getattr(self, f"row_end_{group}") - first  # (F_g,)
        weight = self.weight(group)
        n_feats = len(sizes)
        per_chunk = n_feats
        if values.device.type == "cpu":
            per_chunk = max(1, min(n_feats, _CPU_LOOKUP_CHUNK_BYTES // max(1, batch * weight.shape[1] * weight.element_size())))
        uniform = len(set(sizes)) == 1
        if uniform:
            ids = values.view(n_feats, sizes[0])
            if sizes[0] and bool((ids.amax(1) >= table_rows).any()):
                self._raise_out_of_range(feats, values, sizes)
            rows = (ids + first.unsqueeze(1)).view(-1)
        else:
            table = torch.repeat_interleave(
                torch.arange(n_feats, device=values.device), torch.tensor(sizes, device=values.device),
                output_size=values.numel(),
            )  # (T_g,) feature of each id
            if values.numel() and bool((values >= table_rows[table]).any()):
                self._raise_out_of_range(feats, values, sizes)
            rows = values + first[table]
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])  # (F_g·B + 1,) bag starts, then the total
        chunks, start = [], 0
        for lo in range(0, n_feats, per_chunk):
            hi = min(lo + per_chunk, n_feats)
            count = sum(sizes[lo:hi])
            bounds = offsets[lo * batch:hi * batch + 1]  # the chunk's bags, from its first id (= start) on
            chunks.append((rows[start:start + count], bounds - start if start else bounds))
            start += count
        return rows, chunks

    def _raise_out_of_range(self, feats: list[str], values: torch.Tensor, sizes: list[int]) -> None:
        """Name the first feature with an id >= its table's rows, and the id."""
        start = 0
        for f, n in zip(feats, sizes):
            table = self._feature_table[f]
            chunk = values[start:start + n]
            bad = chunk[chunk >= table.num_embeddings]
            if bad.numel():
                raise ValueError(
                    f"feature {f!r}: id {int(bad[0])} out of range for table {table.name!r} with "
                    f"{table.num_embeddings} rows (ids must be 0..{table.num_embeddings - 1}; hash or cap raw ids first)"
                )
            start += n

    def extra_repr(self) -> str:
        tables = ", ".join(f"{t.name}({t.num_embeddings}x{t.embedding_dim},{t.pooling})" for t in self.tables)
        return f"tables=[{tables}], widths={list(self.widths)}, optimizer={self.optimizer!r}, lr={self.lr}"
