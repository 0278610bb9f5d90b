"""Columnar loader: every session once per epoch, seeded shuffles, trimmed widths, aligned targets."""

import pytest
import torch

from sessrec.data import SessionLoader


def padded(n=10, width=6):
    rows = []
    for i in range(n):
        k = 1 + i % width
        rows.append([0] * (width - k) + list(range(100 + i * 10, 100 + i * 10 + k)))
    return torch.tensor(rows)


def test_unshuffled_batches_are_slices_trimmed_to_longest():
    items = padded()
    batches = list(SessionLoader(items, batch_size=4))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert [b.items.shape[1] for b in batches] == [4, 6, 4]  # lengths 1-4 | 5,6,1,2 | 3,4
    assert torch.equal(batches[0].items, items[:4, -4:])
    assert torch.equal(torch.cat([b.index for b in batches]), torch.arange(10))


def test_shuffle_covers_every_row_once_and_changes_per_epoch():
    items, targets = padded(103), torch.arange(103) + 7
    loader = SessionLoader(items, targets, batch_size=16, shuffle=True, seed=3)
    epochs = []
    for _ in range(2):
        seen = []
        for b in loader:
            width = b.items.shape[1]
            assert torch.equal(b.items, items[b.index][:, -width:])  # rows intact
            assert torch.equal(b.targets, targets[b.index])  # targets follow their rows
            seen.append(b.index)
        epochs.append(torch.cat(seen))
    assert sorted(epochs[0].tolist()) == list(range(103))
    assert not torch.equal(epochs[0], epochs[1])
    again = torch.cat([b.index for b in SessionLoader(items, targets, batch_size=16, shuffle=True, seed=3)])
    assert torch.equal(again, epochs[0])  # seeded


def test_drop_last_and_len():
    loader = SessionLoader(padded(10), batch_size=4, shuffle=True, drop_last=True)
    assert len(loader) == 2
    assert [len(b) for b in loader] == [4, 4]
    assert len(SessionLoader(padded(10), batch_size=4)) == 3


def test_chunked_shuffle_keeps_runs_of_rows():
    loader = SessionLoader(padded(40), batch_size=40, shuffle=True, shuffle_chunk=8, seed=1)
    order = next(iter(loader)).index
    assert sorted(order.tolist()) == list(range(40))
    runs = order.view(5, 8)
    assert torch.equal(runs - runs[:, :1], torch.arange(8).expand(5, 8))
    assert not torch.equal(order, torch.arange(40))


def test_rejects_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        SessionLoader(padded(), batch_size=0)
