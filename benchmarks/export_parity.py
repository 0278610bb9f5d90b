"""Exported session models and DLRM against eager PyTorch: largest score difference and top-20 agreement.

For every encoder (with the objective it trains with) and DLRM, a small seeded model is exported to
ONNX (run under onnxruntime) and TorchScript (``torch.jit.load``) and scored on batches whose size and
length differ from the export example's (left-padded short sessions and sessions longer than
``max_length`` included). One JSON line per (model, format); a format the model cannot take is
reported with the reason ``sessrec export`` gives.

    python benchmarks/export_parity.py
    python benchmarks/export_parity.py --quick   # XLNet-MLM, GRU4Rec (ONNX refused) and dot DLRM, two shapes each
"""

from __future__ import annotations

import argparse
import json
import tempfile

import numpy as np
import pyarrow as pa
import torch

from sessrec.data import ItemVocab
from sessrec.datasets.clickout_rows import RankingVocab
from sessrec.datasets.clickouts import DENSE_FEATURES
from sessrec.lifecycle.export import export_dlrm, export_session_model, max_abs_diff, run_exported
from sessrec.lifecycle.scorers import ExportedClickScorer
from sessrec.models import (
    BertEncoder,
    CausalLanguageModeling,
    ElectraEncoder,
    GPT2Encoder,
    GRU4RecEncoder,
    MaskedItemModeling,
    PermutationLanguageModeling,
    ReplacedTokenDetection,
    SASRecEncoder,
    XLNetEncoder,
)
from sessrec.tasks import DLRMTask, NextItemTask

SESSION_MODELS = {
    "xlnet-mlm": (lambda: XLNetEncoder(d_model=32, n_head=2, n_layer=2), MaskedItemModeling),
    "xlnet-plm": (lambda: XLNetEncoder(d_model=32, n_head=2, n_layer=2), PermutationLanguageModeling),
    "bert-mlm": (lambda: BertEncoder(d_model=32, n_head=2, n_layer=2), MaskedItemModeling),
    "electra-rtd": (lambda: ElectraEncoder(d_model=32, n_head=2, n_layer=2), ReplacedTokenDetection),
    "gpt2-clm": (lambda: GPT2Encoder(d_model=32, n_head=2, n_layer=2), CausalLanguageModeling),
    "sasrec-clm": (lambda: SASRecEncoder(d_model=32, n_head=2, n_layer=2), CausalLanguageModeling),
    "gru4rec-clm": (lambda: GRU4RecEncoder(d_model=32), CausalLanguageModeling),
}
SHAPES = [(1, 1), (7, 13), (33, 4), (64, 20)]  # (batch, length); max_length is 10
DLRM_SHAPES = [(1, 1), (50, 3), (257, 5)]  # (batch, ids per feature)


def sessions(batch: int, length: int, num_items: int, gen: torch.Generator) -> torch.Tensor:
    items = torch.randint(2, num_items, (batch, length), generator=gen)
    keep = torch.randint(1, length + 1, (batch,), generator=gen)  # left-padded to different lengths
    return torch.where(torch.arange(length) >= length - keep[:, None], items, 0)


def session_rows(out: str, shapes: list[tuple[int, int]], names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        encoder, objective = SESSION_MODELS[name]
        torch.manual_seed(0)
        task = NextItemTask(num_items=500, max_length=10, encoder=encoder(), objective=objective()).eval()
        task.vocab = ItemVocab(pa.array(np.arange(498)), np.ones(498, dtype=np.int64))  # 498 items, padding and OOV
        for fmt in ("onnx", "torchscript"):
            try:
                path = export_session_model(task.recommender(), f"{out}/{name}-{fmt}", fmt)
            except ValueError as err:
                rows.append({"model": name, "format": fmt, "exported": False, "reason": str(err)})
                continue
            diffs, same_top = [], True
            gen = torch.Generator().manual_seed(1)
            for batch, length in shapes:
                items = sessions(batch, length, 500, gen)
                with torch.no_grad():
                    expected = task.predict_step(type("B", (), {"items": items})(), 0)
                    scores = task.model(items, task.objective).numpy()
                actual = run_exported(path, items)[0]
                diffs.append(max_abs_diff(actual, scores))
                top = torch.from_numpy(np.where(np.isfinite(actual), actual, -np.inf)).topk(20, dim=1).indices
                same_top &= bool(torch.equal(top, expected.items))
            rows.append({"model": name, "format": fmt, "exported": True, "max_abs_diff": max(diffs),
                         "identical_top20": same_top, "shapes": shapes})
    return rows


def dlrm_rows(out: str, shapes: list[tuple[int, int]], interactions: list[str]) -> list[dict]:
    rows = []
    for interaction in interactions:
        torch.manual_seed(0)
        sizes = {"hotel": 200, "position": 25, "platform": 10, "city": 50, "device": 4, "last_action": 12, "filters": 30}
        task = DLRMTask(cardinalities={name: n + 2 for name, n in sizes.items()}, num_dense=len(DENSE_FEATURES),
                        network={"embedding_dim": 8, "dense_layers": [32, 8], "over_layers": [32, 16],
                                 "interaction": interaction}).eval()
        task.vocab = RankingVocab({  # a click-out row's features, `sizes` values each (and no training clicks)
            name: ItemVocab(pa.array([f"{name}{i}" for i in range(sizes.get(name, 0))], pa.string()),
                            np.ones(sizes.get(name, 0), dtype=np.int64))
            for name in RankingVocab.empty().vocabs})
        scorer = ExportedClickScorer(task.ranker())
        for fmt in ("onnx", "torchscript"):
            path = export_dlrm(task.ranker(), f"{out}/dlrm-{interaction}-{fmt}", fmt)
            diffs = []
            for batch, hot in shapes:
                inputs = scorer.example(batch, hot, seed=batch)
                with torch.no_grad():
                    expected = scorer.eager(*inputs).numpy()
                diffs.append(max_abs_diff(run_exported(path, *inputs)[0], expected))
            rows.append({"model": f"dlrm-{interaction}", "format": fmt, "exported": True, "max_abs_diff": max(diffs),
                         "shapes": shapes})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke size: XLNet-MLM, GRU4Rec (refused by ONNX) and the dot DLRM, the first two shapes of each")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names, interactions = list(SESSION_MODELS), ["dot", "dcn"]
    shapes, dlrm_shapes = SHAPES, DLRM_SHAPES
    if args.quick:
        names, interactions, shapes, dlrm_shapes = ["xlnet-mlm", "gru4rec-clm"], ["dot"], SHAPES[:2], DLRM_SHAPES[:2]
    with tempfile.TemporaryDirectory() as out:
        for row in session_rows(out, shapes, names) + dlrm_rows(out, dlrm_shapes, interactions):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
