"""Columnar loader: every session once per epoch, seeded shuffles, trimmed widths, aligned targets."""

import re
from types import SimpleNamespace

import pyarrow as pa
import pytest
import torch

import sessrec.models as m
from sessrec.data import SessionBatch, SessionLoader, SessionSplits, SyntheticSource
from sessrec.data.sources import SessionSource
from sessrec.tasks import NextItemTask, SessionDataModule
from sessrec.tasks.losses import FullSoftmax, SampledSoftmax


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


@pytest.mark.parametrize("other, named", [
    ({"batch_size": 8}, "--data.batch_size 16, this loader with 8"),
    ({"items": padded(110)}, "training rows (the sessions, --data.train_prefixes, --data.augment_reversed) 103, this "
                             "loader with 110"),
    ({"shuffle_chunk": 4}, "--data.shuffle_chunk 1, this loader with 4"),
    ({"bucket_batches": 2}, "--data.bucket_batches 0, this loader with 2"),
])
def test_a_mid_epoch_state_resumes_only_with_the_rows_and_batches_it_counted(other, named):
    """The saved position counts batches of the epoch's order: a loader of other rows, another batch size or
    another order would skip other rows, training some twice and others never, so it refuses the state; with
    the same ones the epoch ends with every row once."""
    items = padded(103)
    loader = SessionLoader(items, batch_size=16, shuffle=True, seed=3)
    batches = iter(loader)
    seen = torch.cat([next(batches).index for _ in range(3)])
    state = loader.state_dict()
    settings = {"items": items, "batch_size": 16, "shuffle": True, "seed": 3, **other}
    with pytest.raises(ValueError, match=re.escape(f"the saved loader state stands 3 batches into epoch 0 with {named}: "
                                                   "resume mid-epoch with the rows and batches it was trained with")):
        SessionLoader(**settings).load_state_dict(state)
    resumed = SessionLoader(items, batch_size=16, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    rest = torch.cat([b.index for b in resumed])
    assert sorted(torch.cat([seen, rest]).tolist()) == list(range(103))
    fresh = SessionLoader(items, batch_size=8, shuffle=True, seed=3)
    fresh.load_state_dict(SessionLoader(items, batch_size=16, shuffle=True, seed=3).state_dict())  # no batch yet
    assert sorted(torch.cat([b.index for b in fresh]).tolist()) == list(range(103))


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


def test_refuses_tensors_on_different_devices_and_numpy_gathers_off_the_host():
    items = padded()
    with pytest.raises(ValueError, match="'targets' is on meta but the items are on cpu"):
        SessionLoader(items, targets=torch.zeros(items.shape[0], dtype=torch.long, device="meta"), batch_size=4)
    with pytest.raises(ValueError, match="gather='numpy' reads host memory, but the items are on meta"):
        SessionLoader(items.to("meta"), batch_size=4, gather="numpy")
    assert SessionLoader(items.to("meta"), batch_size=4).gather == "torch"  # a device-resident split


def test_side_features_follow_their_rows_and_trim():
    items = padded(23)
    price = items.float() / 10
    loader = SessionLoader(items, features={"price": price}, batch_size=5, shuffle=True, seed=2)
    for b in loader:
        width = b.items.shape[1]
        assert b.items.dtype == items.dtype and b.index.dtype == torch.int64
        assert torch.equal(b.features["price"], price[b.index][:, -width:])
        assert torch.equal(b.features["price"], b.items.float() / 10)


@pytest.mark.parametrize("gather", ["numpy", "torch"])
def test_times_follow_their_rows_and_trim(gather):
    items = padded(23)  # row i: 1 + i % 6 items, right-aligned
    # time of the item in column j of row i: 1e9 + 1000 i + j seconds; 0 on padding
    stamps = 1e9 + 1000.0 * torch.arange(23, dtype=torch.float64)[:, None] + torch.arange(6, dtype=torch.float64)[None, :]
    times = stamps.masked_fill(items == 0, 0.0)
    loader = SessionLoader(items, times=times, batch_size=5, shuffle=True, seed=2, gather=gather)
    seen = []
    for b in loader:
        width = b.items.shape[1]
        assert b.times.dtype == torch.float64 and b.times.shape == b.items.shape
        assert torch.equal(b.times, times[b.index][:, -width:])
        seen.append(b.index)
    assert sorted(torch.cat(seen).tolist()) == list(range(23))
    # by hand: row 10 holds 5 items (columns 1..5), row 17 holds 6
    batch = next(b for b in loader if 10 in b.index.tolist())
    row = batch.times[batch.index.tolist().index(10)].tolist()
    assert row[-5:] == [1e9 + 10_000 + j for j in range(1, 6)] and all(t == 0 for t in row[:-5])
    assert SessionLoader(items, batch_size=5).__iter__().__next__().times is None
    with pytest.raises(ValueError, match=r"times has shape \(23, 5\), items \(23, 6\)"):
        SessionLoader(items, times=times[:, 1:])


def test_datamodule_stores_item_ids_as_int32_and_targets_as_int64():
    dm = SessionDataModule(SyntheticSource(num_sessions=300, num_items=40), max_length=8, batch_size=32)
    train, _ = dm.tensors("train")
    valid, targets = dm.tensors("valid")
    assert train.dtype == valid.dtype == torch.int32 and targets.dtype == torch.int64
    assert next(iter(dm.train_dataloader())).items.dtype == torch.int32


class TimedLog(SessionSource):
    """Three tiny splits; with `times`, event j of a session in split s (0 train, 1 valid, 2 test) happens at
    1e9 + 1e5 * s + 100 * row + j seconds."""

    def __init__(self, times: bool = True) -> None:
        self.times = times

    def load(self) -> SessionSplits:
        def table(sessions, s):
            cols = {"session_id": list(range(10 * s, 10 * s + len(sessions))), "item_id": sessions}
            if self.times:
                cols["timestamp"] = [[1e9 + 1e5 * s + 100 * r + j for j in range(len(x))] for r, x in enumerate(sessions)]
            return pa.table(cols)

        train = [[10, 11, 12, 13], [12, 13], [11, 12, 10]]
        return SessionSplits(table(train, 0), table([[10, 11, 12]], 1), table([[13, 12], [12, 10, 11, 13]], 2), source="log")


def running(uses_times: bool) -> SimpleNamespace:
    """A stand-in trainer whose task does (or does not) read event times."""
    return SimpleNamespace(lightning_module=SimpleNamespace(uses_times=uses_times), global_rank=0, world_size=1)


def test_datamodule_batches_carry_event_times_when_asked():
    dm = SessionDataModule(TimedLog(), max_length=3, batch_size=8, eval_batch_size=8, times=True)
    train = next(iter(dm.train_dataloader()))
    by_row = dict(zip(train.index.tolist(), train.times.tolist()))
    t = 1e9
    assert train.times.dtype == torch.float64 and train.times.shape == train.items.shape == (3, 3)
    assert by_row == {0: [t + 1, t + 2, t + 3], 1: [0.0, t + 100, t + 101], 2: [t + 200, t + 201, t + 202]}
    valid = next(iter(dm.val_dataloader()))  # [10, 11] -> 12: the prefix's times (trimmed), never the target's
    assert valid.times.tolist() == [[t + 1e5, t + 1e5 + 1]]
    test = next(iter(dm.test_dataloader()))  # [13] -> 12 and [12, 10, 11] -> 13
    assert test.times.tolist() == [[0.0, 0.0, t + 2e5], [t + 2e5 + 100, t + 2e5 + 101, t + 2e5 + 102]]
    assert dm.time_tensor("test") is dm.pairs("test").times  # the evaluation pairs' own times

    auto = SessionDataModule(TimedLog(), max_length=3, batch_size=8)  # times=None: as the task asks
    assert next(iter(auto.train_dataloader())).times is None and not auto._times  # no trainer: none built
    auto.trainer = running(uses_times=False)
    assert next(iter(auto.val_dataloader())).times is None and not auto._times
    auto.trainer = running(uses_times=True)
    assert next(iter(auto.val_dataloader())).times.tolist() == valid.times.tolist()
    off = SessionDataModule(TimedLog(), max_length=3, times=False)
    off.trainer = running(uses_times=True)
    assert next(iter(off.train_dataloader())).times is None

    untimed = SessionDataModule(TimedLog(times=False), max_length=3, batch_size=8)
    untimed.trainer = running(uses_times=True)
    assert next(iter(untimed.train_dataloader())).times is None and untimed.pairs("valid").times is None
    with pytest.raises(ValueError, match=r"log \(train split\): times=True, but the sessions have no 'timestamp' column"):
        SessionDataModule(TimedLog(times=False), max_length=3, times=True).train_dataloader()


PAIRS = {
    "xlnet-mlm": lambda: (m.XLNetEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), m.MaskedItemModeling(0.3, 0.3)),
    "xlnet-plm": lambda: (
        m.XLNetEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), m.PermutationLanguageModeling(0.3, 0.3)
    ),
    "electra-rtd": lambda: (
        m.ElectraEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), m.ReplacedTokenDetection(0.3, 0.3)
    ),
    "gpt2-clm": lambda: (m.GPT2Encoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), m.CausalLanguageModeling()),
    "gru4rec-clm": lambda: (m.GRU4RecEncoder(d_model=16, n_layer=1), m.CausalLanguageModeling()),
}


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("sampled", [False, True])
def test_int32_and_int64_batches_give_the_same_loss_gradients_and_scores(pair, sampled):
    """The loader's int32 ids are a storage choice only: every objective and loss sees the same numbers."""
    torch.manual_seed(0)
    encoder, objective = PAIRS[pair]()
    loss = SampledSoftmax(negatives="mixed", num_samples=16) if sampled else FullSoftmax()
    task = NextItemTask(num_items=40, max_length=8, encoder=encoder, objective=objective, loss=loss)
    items = torch.randint(2, 40, (12, 8))  # ids 2.. (0 padding, 1 OOV)
    items[::3, :4] = 0  # left padding
    runs = []
    for dtype in (torch.int64, torch.int32):
        task.zero_grad()
        torch.manual_seed(1)  # the same dropout masks for both runs
        value = task.training_step(SessionBatch(items=items.to(dtype)), 0)
        value.backward()
        task.eval()
        with torch.no_grad():
            scores = task(SessionBatch(items=items.to(dtype)))
        task.train()
        runs.append((value.detach(), [p.grad.clone() for p in task.parameters() if p.grad is not None], scores))
    (loss64, grads64, scores64), (loss32, grads32, scores32) = runs
    assert torch.isfinite(loss64) and loss64 > 0
    torch.testing.assert_close(loss32, loss64, rtol=0, atol=0)
    assert len(grads32) == len(grads64) > 0
    for g32, g64 in zip(grads32, grads64):
        torch.testing.assert_close(g32, g64, rtol=0, atol=0)
    torch.testing.assert_close(scores32, scores64, rtol=0, atol=0)


@pytest.mark.parametrize("shuffle", [True, False])
def test_torch_gather_cuts_the_same_batches_as_numpy(shuffle):
    """The gather a device-resident split uses (`index_select`), checked against the NumPy path on CPU."""
    gen = torch.Generator().manual_seed(0)
    items = torch.randint(2, 50, (103, 9), generator=gen, dtype=torch.int32)
    items[:, :3] = 0
    items[::7, :6] = 0  # sessions of other lengths: the batches' widths differ
    targets, feats = torch.randint(2, 50, (103,), generator=gen), {"f": torch.randn(103, 9, generator=gen)}
    loaders = [SessionLoader(items, targets, feats, batch_size=10, shuffle=shuffle, drop_last=shuffle, seed=3, gather=g)
               for g in ("numpy", "torch")]
    for loader in loaders:
        loader.set_epoch(1)
    pairs = list(zip(*loaders))
    assert len(pairs) == len(loaders[0]) == len(loaders[1])
    for a, b in pairs:
        for x, y in ((a.items, b.items), (a.targets, b.targets), (a.index, b.index), (a.features["f"], b.features["f"])):
            assert torch.equal(x, y)


@pytest.mark.gpu
def test_cuda_resident_split_gives_the_host_batches_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from sessrec.data import SyntheticSource
    from sessrec.tasks import SessionDataModule

    host = SessionDataModule(SyntheticSource(num_sessions=500, num_items=50), max_length=8, batch_size=32)
    resident = SessionDataModule(SyntheticSource(num_sessions=500, num_items=50), max_length=8, batch_size=32, device="cuda")
    for a, b in zip(host.train_dataloader(), resident.train_dataloader()):
        assert b.items.is_cuda and torch.equal(a.items, b.items.cpu()) and torch.equal(a.index, b.index.cpu())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_resident_split_carries_the_host_times(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    host = SessionDataModule(TimedLog(), max_length=3, batch_size=2, times=True)
    resident = SessionDataModule(TimedLog(), max_length=3, batch_size=2, times=True, device=device)
    for split in ("train_dataloader", "test_dataloader"):
        for a, b in zip(getattr(host, split)(), getattr(resident, split)()):
            assert b.times.device.type == device and torch.equal(a.times, b.times.cpu())
            assert torch.equal(a.items, b.items.cpu())


def varied(n=203, width=30, seed=0):
    """(n, width) right-aligned rows of random lengths 1..width."""
    lengths = torch.randint(1, width + 1, (n,), generator=torch.Generator().manual_seed(seed))
    cols = torch.arange(width)[None, :] >= width - lengths[:, None]
    return torch.where(cols, torch.arange(n)[:, None] + 1, 0), lengths


def test_bucketed_batches_hold_like_lengths_every_row_once_seeded():
    items, lengths = varied()
    loader = SessionLoader(items, batch_size=10, shuffle=True, bucket_batches=4, seed=5)
    batches = list(loader)
    index = torch.cat([b.index for b in batches])
    assert sorted(index.tolist()) == list(range(203))
    for b in batches:
        assert torch.equal(b.items, items[b.index][:, -b.items.shape[1]:])
        assert b.items.shape[1] == int(lengths[b.index].max())
    # within a pool of 4 batches the lengths are sorted: each batch spans a quarter of a pool's range
    cells = sum(b.items.numel() for b in batches)
    mixed = sum(b.items.numel() for b in SessionLoader(items, batch_size=10, shuffle=True, seed=5))
    assert cells < 0.75 * mixed
    assert [len(b) for b in batches][-1] == 3 and all(len(b) == 10 for b in batches[:-1])  # the incomplete one last
    again = torch.cat([b.index for b in SessionLoader(items, batch_size=10, shuffle=True, bucket_batches=4, seed=5)])
    assert torch.equal(again, index)
    assert not torch.equal(torch.cat([b.index for b in loader]), index)  # the next epoch draws anew


def test_one_pool_is_a_global_sort_and_batches_come_shuffled():
    items, lengths = varied(n=100)
    batches = list(SessionLoader(items, batch_size=10, shuffle=True, bucket_batches=10, seed=1))
    spans = [(int(lengths[b.index].min()), int(lengths[b.index].max())) for b in batches]
    ordered = sorted(spans)
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(ordered, ordered[1:]))  # disjoint length ranges
    assert spans != ordered  # the batches' order is shuffled


def test_bucketed_ranks_share_each_step_rows_of_like_lengths():
    items, lengths = varied(n=120)
    ranks = [list(SessionLoader(items, batch_size=5, shuffle=True, bucket_batches=12, seed=2, rank=r, world_size=2))
             for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 12
    rows = [torch.cat([b.index for b in batches]) for batches in ranks]
    assert sorted(torch.cat(rows).tolist()) == list(range(120))
    # one pool: each step's two batches are one sorted group of 10 rows, and the groups' length ranges are disjoint
    spans = sorted((int(lengths[a.index].min().minimum(lengths[b.index].min())),
                    int(lengths[a.index].max().maximum(lengths[b.index].max()))) for a, b in zip(*ranks))
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:]))


def test_bucketing_needs_a_row_shuffle():
    with pytest.raises(ValueError, match="bucket_batches needs shuffle"):
        SessionLoader(padded(10), batch_size=4, bucket_batches=2)
    with pytest.raises(ValueError, match="bucket_batches needs shuffle"):
        SessionLoader(padded(10), batch_size=4, shuffle=True, shuffle_chunk=2, bucket_batches=2)


def test_trimmed_batches_score_as_the_full_width():
    """A model's outputs for a row do not depend on the left padding the loader trims: positions count
    from the first real item (causal) or from the end (bidirectional), and no real position attends to padding."""
    items = padded(8, width=12)
    for encoder, objective in ((m.SASRecEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0), m.CausalLanguageModeling()),
                               (m.SASRecEncoder(d_model=16, n_head=2, dropout=0.0, gated=True, feed_forward="swiglu"),
                                m.CausalLanguageModeling()),
                               (m.BertEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), m.MaskedItemModeling())):
        torch.manual_seed(0)
        model = m.SessionModel(num_items=200, encoder=encoder, max_length=12).eval()
        with torch.no_grad():
            full = model(items, objective)
            trimmed = torch.cat([model(b.items, objective) for b in SessionLoader(items, batch_size=3)])
        assert [b.items.shape[1] for b in SessionLoader(items, batch_size=3)] == [3, 6, 8]  # of 12
        torch.testing.assert_close(trimmed, full, atol=1e-5, rtol=1e-5)
