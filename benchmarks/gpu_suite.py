"""The GPU benchmarks, one JSON line per item: run on a GPU machine, reported as skipped elsewhere.

Items (each timed after warm-up, medians of `--repeats`, CUDA synchronised around every timing):

- ``xlnet_mlm_fit``: XLNet-MLM training steps (masking, encoder, full-softmax cross-entropy,
  backward, fused AdamW) with bf16 autocast: sessions/s.
- ``encoder_steps``: one training step (objective, encoder, full-softmax cross-entropy over the
  catalogue, backward, AdamW) of XLNet-MLM, SASRec, and HSTU on its jagged and its padded path, at
  the same width on the same mixed-length sessions, with bf16 autocast: milliseconds per step of each.
- ``encoder_widths``: the same training step of XLNet-MLM and HSTU (padded) at d_model 128 and 512: sessions/s,
  the step's floating-point operations as `torch.utils.flop_counter.FlopCounterMode` counts them (matrix
  products, attention, forward and backward), and the share of the chip's bf16 matrix rate that reaches,
  that rate measured in the same run (an 8192 x 8192 x 8192 bf16 product).
- ``dlrm_train``: DLRM training steps (26 tables, fused row-wise Adagrad in backward, Adam on the
  MLPs) on random Criteo-like batches: samples/s.
- ``embedding_lookup``: the fused embedding core's pooled lookup (26 tables, 10-hot): GB/s of rows
  read, and as a share of the device's copy bandwidth measured in the same run (``dst.copy_(src)``).
- ``feature_etl``: the feature pipeline (categorify, count and target encoding, hashed cross,
  log-normalise) fitted and applied on CuPy arrays against NumPy: rows/s of each and the speed-up.
- ``resident_loader``: an epoch of `SessionLoader` batches with the split held on the device
  (`SessionDataModule(device=...)`) against host batches copied to the device: sessions/s of each.

``--device auto`` (the default) runs on CUDA when there is a GPU and reports every item as skipped
otherwise; ``--device cpu --quick`` runs the same code on the CPU at small sizes (a smoke test of
the code paths, not a measurement). ``benchmarks/gpu_suite.sh`` adds the gpu-marked tests.

    python benchmarks/gpu_suite.py                   # on a GPU machine: the figures
    python benchmarks/gpu_suite.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from sessrec.data.loader import SessionLoader
from sessrec.data.vocab import NUM_SPECIAL
from sessrec.embeddings import FusedEmbeddingBagCollection, FusedTables, SparseFeatures, TableConfig
from sessrec.models import (
    DLRM,
    CausalLanguageModeling,
    HSTUEncoder,
    MaskedItemModeling,
    Objective,
    SASRecEncoder,
    SessionModel,
    XLNetEncoder,
)
from sessrec.tasks.optim import adamw


def timed(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of `fn` over `repeats` calls after `warmup`, synchronising CUDA around each."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sessions(n: int, length: int, items: int, gen: torch.Generator) -> torch.Tensor:
    """(n, length) right-aligned random sessions of lengths 2..length, 0 = padding."""
    ids = torch.randint(NUM_SPECIAL, items + NUM_SPECIAL, (n, length), generator=gen)
    lengths = torch.randint(2, length + 1, (n, 1), generator=gen)
    return ids.masked_fill(torch.arange(length).unsqueeze(0) < length - lengths, 0)


def training_step(model: SessionModel, objective: Objective, data: torch.Tensor) -> Callable[[], None]:
    """One training step of `model` on `data` with bf16 autocast: the objective's inputs and targets,
    full-softmax cross-entropy over the catalogue, backward, AdamW."""
    optimizer, device = adamw(model.parameters(), lr=1e-3), data.device

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            m = objective(data, torch.Generator(device=device).manual_seed(0))
            loss = F.cross_entropy(model.score(model.encode(m.inputs, m.masked)[m.read]).float(), m.targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def xlnet_mlm_fit(device: torch.device, quick: bool, repeats: int) -> dict:
    items, batch, d = (1000, 64, 32) if quick else (50_000, 1024, 128)
    model = SessionModel(num_items=items + NUM_SPECIAL, encoder=XLNetEncoder(d_model=d, n_head=4, n_layer=2), max_length=20)
    model = model.to(device).train()
    data = sessions(batch, 20, items, torch.Generator().manual_seed(0)).to(device)
    seconds = timed(training_step(model, MaskedItemModeling(), data), device, warmup=3, repeats=repeats)
    return {"items": items, "batch": batch, "d_model": d, "precision": "bf16 autocast", "step_ms": round(seconds * 1e3, 2),
            "sessions_per_s": round(batch / seconds, 1)}


def encoder_step(encoder: torch.nn.Module, objective: Objective, items: int, data: torch.Tensor,
                 repeats: int) -> tuple[Callable[[], None], float]:
    """`training_step` of a `SessionModel` over `encoder` (seeded) on `data`'s device, and its median seconds."""
    torch.manual_seed(0)
    model = SessionModel(num_items=items + NUM_SPECIAL, encoder=encoder, max_length=data.shape[1]).to(data.device).train()
    step = training_step(model, objective, data)
    return step, timed(step, data.device, warmup=3, repeats=repeats)


def encoder_steps(device: torch.device, quick: bool, repeats: int) -> dict:
    items, batch, d, length = (1000, 64, 32, 20) if quick else (50_000, 512, 128, 50)
    encoders = {
        "xlnet_mlm": (lambda: XLNetEncoder(d_model=d, n_head=4, n_layer=2), MaskedItemModeling()),
        "sasrec": (lambda: SASRecEncoder(d_model=d, n_head=4, n_layer=2), CausalLanguageModeling()),
        "hstu_jagged": (lambda: HSTUEncoder(d_model=d, n_head=4, n_layer=2, jagged=True), CausalLanguageModeling()),
        "hstu_padded": (lambda: HSTUEncoder(d_model=d, n_head=4, n_layer=2, jagged=False), CausalLanguageModeling()),
    }
    data = sessions(batch, length, items, torch.Generator().manual_seed(0)).to(device)
    out: dict = {"items": items, "batch": batch, "d_model": d, "max_length": length, "precision": "bf16 autocast"}
    for name, (encoder, objective) in encoders.items():
        try:
            out[f"{name}_step_ms"] = round(encoder_step(encoder(), objective, items, data, repeats)[1] * 1e3, 2)
        except Exception as err:  # noqa: BLE001 - one encoder failing must not hide the others' figures
            out[f"{name}_error"] = f"{type(err).__name__}: {err}".splitlines()[0]
    return out


def matmul_peak(device: torch.device, quick: bool, repeats: int) -> float:
    """The device's bf16 matrix rate in FLOP/s: an n x n x n product, n = 8192 (512 with `quick`)."""
    n = 512 if quick else 8192
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    return 2 * n**3 / timed(lambda: a @ b, device, warmup=3, repeats=max(repeats, 3))


def step_flops(step: Callable[[], None]) -> int:
    """Floating-point operations of one call of `step`, as torch's FlopCounterMode counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return counter.get_total_flops()


def encoder_widths(device: torch.device, quick: bool, repeats: int) -> dict:
    items, batch, length = (1000, 32, 20) if quick else (50_000, 512, 50)
    widths = (32, 64) if quick else (128, 512)
    peak = matmul_peak(device, quick, repeats)
    data = sessions(batch, length, items, torch.Generator().manual_seed(0)).to(device)
    out: dict = {"items": items, "batch": batch, "max_length": length, "n_layer": 2, "precision": "bf16 autocast",
                 "bf16_matmul_tflops": round(peak / 1e12, 1)}
    for d in widths:
        heads = max(d // 64, 2)
        encoders = {
            "xlnet_mlm": (partial(XLNetEncoder, d_model=d, n_head=heads, n_layer=2), MaskedItemModeling()),
            "hstu": (partial(HSTUEncoder, d_model=d, n_head=heads, n_layer=2, jagged=False), CausalLanguageModeling()),
        }
        for name, (encoder, objective) in encoders.items():
            key = f"{name}_d{d}"
            try:
                step, seconds = encoder_step(encoder(), objective, items, data, repeats)
                flops = step_flops(step)
                out.update({f"{key}_step_ms": round(seconds * 1e3, 2), f"{key}_sessions_per_s": round(batch / seconds),
                            f"{key}_gflop_per_step": round(flops / 1e9, 1),
                            f"{key}_share_of_peak": round(flops / seconds / peak, 4)})
            except Exception as err:  # noqa: BLE001 - one encoder failing must not hide the others' figures
                out[f"{key}_error"] = f"{type(err).__name__}: {err}".splitlines()[0]
    return out


def tables(quick: bool, dim: int) -> list[TableConfig]:
    rows = np.geomspace(1e3, 1e4 if quick else 1e6, 26).astype(int)
    return [TableConfig(f"t{i}", int(n), dim) for i, n in enumerate(rows)]


def random_ids(configs: list[TableConfig], batch: int, hot: int, device: torch.device) -> SparseFeatures:
    gen = torch.Generator().manual_seed(1)
    ids = {t.name: torch.randint(0, t.num_embeddings, (batch, hot), generator=gen) for t in configs}
    return SparseFeatures.from_dense(ids).to(device)


def dlrm_train(device: torch.device, quick: bool, repeats: int) -> dict:
    batch, dim = (256, 16) if quick else (16_384, 64)
    configs = tables(quick, dim)
    model = DLRM(13, configs, dense_layers=[128, dim], over_layers=[256, 128],
                 sparse=FusedTables(optimizer="adagrad_rowwise", lr=0.05), seed=0).to(device)
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("sparse_arch")]
    optimizer = torch.optim.Adam(dense_params, lr=1e-3)
    dense = torch.randn(batch, 13, generator=torch.Generator().manual_seed(0)).to(device)
    sparse = random_ids(configs, batch, 1, device)
    labels = (torch.rand(batch, generator=torch.Generator().manual_seed(2)) < 0.25).float().to(device)

    def step() -> None:
        loss = F.binary_cross_entropy_with_logits(model(dense, sparse), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    seconds = timed(step, device, warmup=3, repeats=repeats)
    return {"batch": batch, "tables": len(configs), "dim": dim, "step_ms": round(seconds * 1e3, 2),
            "samples_per_s": round(batch / seconds, 1)}


def embedding_lookup(device: torch.device, quick: bool, repeats: int) -> dict:
    batch, dim, hot = (512, 16, 10) if quick else (16_384, 64, 10)
    configs = tables(quick, dim)
    core = FusedEmbeddingBagCollection(configs, seed=0).to(device)
    ids = random_ids(configs, batch, hot, device)
    with torch.no_grad():
        seconds = timed(lambda: core(ids), device, warmup=3, repeats=repeats)
    row_bytes = len(configs) * batch * hot * dim * 4  # fp32 rows read
    size = (64 if quick else 1024) << 20
    src, dst = torch.empty(size, dtype=torch.uint8, device=device), torch.empty(size, dtype=torch.uint8, device=device)
    copy_seconds = timed(lambda: dst.copy_(src), device, warmup=2, repeats=repeats)
    lookup_gbs, copy_gbs = row_bytes / seconds / 1e9, 2 * size / copy_seconds / 1e9  # a copy reads and writes
    return {"batch": batch, "tables": len(configs), "dim": dim, "hot": hot, "lookup_ms": round(seconds * 1e3, 3),
            "rows_gb_per_s": round(lookup_gbs, 1), "copy_gb_per_s": round(copy_gbs, 1),
            "share_of_copy_bandwidth": round(lookup_gbs / copy_gbs, 3)}


def feature_etl(device: torch.device, quick: bool, repeats: int) -> dict:
    try:
        import cupy
    except ImportError:
        return {"status": "skipped", "reason": "CuPy is not installed (pip install -e '.[gpu]')"}
    from sessrec.features import (
        Categorify,
        CountEncoding,
        FeaturePipeline,
        HashedCross,
        LogNormalize,
        TargetEncoding,
    )

    n = 100_000 if quick else 10_000_000
    gen = np.random.default_rng(0)
    host = {"item_id": gen.zipf(1.2, n) % 1_000_000, "category": gen.integers(0, 500, n),
            "session_id": np.sort(gen.integers(0, n // 5, n)), "clicked": (gen.random(n) < 0.1).astype(np.float32),
            "price": gen.lognormal(3.0, 1.0, n).astype(np.float32)}

    def pipeline() -> FeaturePipeline:
        return FeaturePipeline({
            "item": Categorify("item_id", min_count=2), "item_count": CountEncoding("item_id"),
            "category_ctr": TargetEncoding("category", "clicked", "session_id", n_folds=5),
            "cross": HashedCross(["item_id", "category"], buckets=1 << 20), "price": LogNormalize("price"),
        })

    gpu = {k: cupy.asarray(v) for k, v in host.items()}
    cpu_seconds = timed(lambda: pipeline().fit_transform(host), torch.device("cpu"), warmup=1, repeats=repeats)
    gpu_seconds = timed(lambda: pipeline().fit_transform(gpu), device, warmup=1, repeats=repeats)
    return {"rows": n, "numpy_rows_per_s": round(n / cpu_seconds), "cupy_rows_per_s": round(n / gpu_seconds),
            "speedup": round(cpu_seconds / gpu_seconds, 2)}


def resident_loader(device: torch.device, quick: bool, repeats: int) -> dict:
    n, batch = (20_000, 256) if quick else (2_000_000, 1024)
    split = sessions(n, 20, 100_000, torch.Generator().manual_seed(0)).int()
    host = SessionLoader(split, batch_size=batch, shuffle=True, seed=0)
    resident = SessionLoader(split.to(device), batch_size=batch, shuffle=True, seed=0)

    def host_epoch() -> None:
        for b in host:
            b.to(device, non_blocking=True)

    def resident_epoch() -> None:
        for _ in resident:
            pass

    host_seconds = timed(host_epoch, device, warmup=1, repeats=repeats)
    resident_seconds = timed(resident_epoch, device, warmup=1, repeats=repeats)
    return {"sessions": n, "batch": batch, "host_then_copy_sessions_per_s": round(n / host_seconds),
            "resident_sessions_per_s": round(n / resident_seconds), "speedup": round(host_seconds / resident_seconds, 2)}


ITEMS = {fn.__name__: fn for fn in (xlnet_mlm_fit, encoder_steps, encoder_widths, dlrm_train, embedding_lookup, feature_etl, resident_loader)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is a GPU, else all skipped), cuda, cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the code paths")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--items", nargs="+", choices=sorted(ITEMS), default=list(ITEMS))
    args = parser.parse_args()
    torch.manual_seed(0)
    name = "cuda" if args.device == "auto" else args.device
    if name == "cuda" and not torch.cuda.is_available():
        for item in args.items:
            print(json.dumps({"suite": "gpu", "item": item, "status": "skipped",
                              "reason": "no CUDA device (torch.cuda.is_available() is False)"}))
        return
    device = torch.device(name)
    described = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for item in args.items:
        row = {"suite": "gpu", "item": item, "device": described, "torch": torch.__version__, "quick": args.quick}
        try:
            result = ITEMS[item](device, args.quick, args.repeats)
            row.update({"status": "ok", **result} if "status" not in result else result)
        except Exception as err:  # noqa: BLE001 - one failing item must not hide the others' figures
            row.update({"status": "failed", "error": f"{type(err).__name__}: {err}".splitlines()[0]})
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
