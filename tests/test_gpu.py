"""GPU paths (skipped without CUDA): the same model and loader on CUDA agree with the CPU path."""

import pytest
import torch

from sessrec.data import SessionLoader
from sessrec.models import SessionModel, XLNetEncoder


def tiny():
    torch.manual_seed(0)
    return SessionModel(40, XLNetEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=7).eval()


ITEMS = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 9, 12, 2]])


def test_cpu_scores_are_finite_on_items():  # the CPU twin of the CUDA check below
    scores = tiny()(ITEMS)
    assert torch.isfinite(scores[:, 2:]).all()


@pytest.mark.gpu
def test_cuda_matches_cpu():
    model = tiny()
    cpu = model(ITEMS)
    gpu = model.to("cuda")(ITEMS.to("cuda"))
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_pinned_batches_copy_to_cuda():
    loader = SessionLoader(ITEMS, torch.tensor([8, 10]), batch_size=2, pin_memory=True)
    batch = next(iter(loader))
    assert batch.items.is_pinned()
    moved = batch.to("cuda", non_blocking=True)
    assert moved.items.is_cuda and torch.equal(moved.items.cpu(), ITEMS)
