"""Streamed training batches: the in-memory path's rows, once per epoch, seeded, split across ranks, resumable."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch

import sessrec.models as m
from sessrec.data import ItemVocab, SessionLoader, SessionSplits, SideFeatures, SyntheticSource, frame
from sessrec.data.prepared.dataset import VERSION, PreparedSource
from sessrec.data.sources import SessionSource
from sessrec.data.streaming import StreamingLoader
from sessrec.features.side_transform import SideFeatureTransform
from sessrec.saved.atomic import digest
from sessrec.saved.directory import HASH, content_hash
from sessrec.tasks import NextItemTask, SessionDataModule

torch.set_num_threads(1)
L = 6  # max_length: long enough to keep most sessions whole, short enough to cut some


def synthetic(virtual: bool = False) -> SessionSplits:
    """~500 training sessions with timestamps; with `virtual`, the events of items divisible by 7 are virtual."""
    splits = SyntheticSource(num_sessions=600, num_items=50).load()
    if not virtual:
        return splits

    def mark(table: pa.Table) -> pa.Table:
        values, offsets = frame.list_offsets(table.column("item_id"))
        flags = pa.array(values.to_numpy() % 7 == 0)
        return table.append_column("virtual", pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flags))
    return SessionSplits(mark(splits.train), mark(splits.valid), mark(splits.test))


def write_prepared(directory: Path, splits: SessionSplits, parts: int = 3, group_rows: int = 16, **settings) -> Path:
    """A prepared dataset of `splits`: each split cut into `parts` parquet parts of `group_rows`-session row groups."""
    listing, sha = {}, {}
    for split in ("train", "valid", "test"):
        table = getattr(splits, split)
        (directory / split).mkdir(parents=True)
        cuts = np.linspace(0, table.num_rows, parts + 1).astype(int)
        names = [f"{split}/part-{i:05d}.parquet" for i in range(parts)]
        for name, a, b in zip(names, cuts[:-1], cuts[1:]):
            pq.write_table(table.slice(a, b - a), directory / name, row_group_size=group_rows)
            sha[name] = digest(directory / name).removeprefix("sha256:")
        listing[split] = {"files": names, "sessions": table.num_rows, "events": int(frame.session_lengths(table).sum())}
    values, _ = frame.list_offsets(splits.train.column("item_id"))
    vocab = ItemVocab.fit(values, settings.get("min_item_count", 1), settings.get("max_vocab_size"),
                          virtual=frame.virtual_flags(splits.train))
    vocab.save(directory / "vocab.parquet")
    sha["vocab.parquet"] = digest(directory / "vocab.parquet").removeprefix("sha256:")  # as `PreparedWriter` records it
    settings = {"min_item_count": 1, "max_vocab_size": None, **settings}
    manifest = {"format": "sessrec-prepared", "version": VERSION, "source": {}, "settings": settings, "splits": listing,
                "sha256": sha}
    manifest[HASH] = content_hash(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


class InMemory(SessionSource):
    def __init__(self, splits: SessionSplits) -> None:
        self.splits = splits

    def load(self) -> SessionSplits:
        return self.splits


def pair(tmp_path, splits=None, group_rows=16, buffer=None, **options):
    """(the in-memory data module, the streaming one with `buffer`) over the same sessions and vocabulary."""
    splits = splits or synthetic()
    directory = tmp_path / "prepared"
    if not directory.exists():
        write_prepared(directory, splits, group_rows=group_rows)
    memory = SessionDataModule(source=InMemory(splits), max_length=L, vocab_path=str(directory / "vocab.parquet"), **options)
    streamed = SessionDataModule(source=PreparedSource(str(directory)), max_length=L, streaming=True, shuffle_buffer=buffer,
                                 **options)
    return memory, streamed


def streamed_rows(loader) -> tuple[list[tuple], list[torch.Tensor]]:
    """Every row of an epoch, padded back to L (items, then each feature and the times), and the batches."""
    batches = list(loader)
    rows = []
    for b in batches:
        cols = [b.items, *(b.features or {}).values(), *([] if b.times is None else [b.times])]
        padded = [torch.nn.functional.pad(c, (L - c.shape[1], 0)) for c in cols]
        rows += [tuple(tuple(c[i].tolist()) for c in padded) for i in range(len(b))]
    return rows, batches


def memory_rows(dm: SessionDataModule) -> list[tuple]:
    items = dm.tensors("train")[0]
    cols = [items, *dm.feature_tensors("train").values(), *([] if dm.batch_times("train") is None else [dm.batch_times("train")])]
    return [tuple(tuple(c[i].tolist()) for c in cols) for i in range(len(items))]


@pytest.mark.parametrize("options", [{}, {"augment_reversed": True}, {"train_prefixes": True},
                                     {"augment_reversed": True, "train_prefixes": True}])
@pytest.mark.parametrize("buffer", [64, 100_000])
def test_an_epoch_holds_the_in_memory_training_rows_once_each(tmp_path, options, buffer):
    splits = synthetic(virtual=True)
    memory, streamed = pair(tmp_path, splits, group_rows=7, buffer=buffer, times=True, batch_size=64, **options)
    loader = streamed.train_dataloader()
    expected = memory_rows(memory)
    assert loader.share == len(expected) and loader.drop_last  # as the in-memory loader: the last partial batch sits out
    loader.drop_last = False  # every row
    rows, batches = streamed_rows(loader)
    assert Counter(rows) == Counter(expected) and len(rows) == len(expected)
    if options.get("train_prefixes"):
        assert len(expected) > 2 * splits.train.num_rows  # the prefixes are there (the Counter checks which)
    for b in batches:  # every batch is trimmed to its longest row, as SessionLoader trims
        assert b.items.shape[1] == max(int((b.items != 0).sum(dim=1).max()), 1) and b.times.shape == b.items.shape


def test_batches_are_the_in_memory_rows_of_their_sessions_with_side_features(tmp_path):
    side = SideFeatures(time=["since_prev"], position=4)
    splits = synthetic()
    SideFeatureTransform(side).fit(splits.train, "train").save(tmp_path / "features.npz")
    memory, streamed = pair(tmp_path, splits, side_features=side, features_path=str(tmp_path / "features.npz"),
                            batch_size=40)
    items, feats = memory.tensors("train")[0], memory.feature_tensors("train")
    loader = streamed.train_dataloader()
    seen = []
    for b in loader:
        width = b.items.shape[1]
        assert width == int((b.items != 0).sum(dim=1).max())
        assert b.items.dtype == items.dtype == torch.int32
        torch.testing.assert_close(b.items, items[b.index][:, -width:], rtol=0, atol=0)
        assert set(b.features) == set(feats) == {"since_prev", "position"}
        for name, value in b.features.items():
            assert value.dtype == feats[name].dtype
            torch.testing.assert_close(value, feats[name][b.index][:, -width:], rtol=0, atol=0)
        seen.append(b.index)
    n = splits.train.num_rows
    assert len(seen) == len(loader) == n // 40  # drop_last, as the in-memory training loader
    assert len(torch.cat(seen).unique()) == len(torch.cat(seen)) == n // 40 * 40


def test_the_order_is_seeded_and_changes_with_the_epoch(tmp_path):
    _, streamed = pair(tmp_path, batch_size=50, buffer=64)
    epoch = lambda loader, e: (loader.set_epoch(e), torch.cat([b.index for b in loader]))[1]
    a, b = streamed.train_dataloader(), streamed.train_dataloader()
    assert torch.equal(epoch(a, 3), epoch(b, 3))
    assert not torch.equal(epoch(a, 3), epoch(a, 4))
    other = SessionDataModule(source=streamed.source, max_length=L, streaming=True, batch_size=50, shuffle_buffer=64, seed=1)
    assert not torch.equal(epoch(other.train_dataloader(), 3), epoch(a, 3))
    first = epoch(a, 0)  # the row groups' own order is not kept: rows of different groups mix in a batch
    assert len(set((first[:50] // 16).tolist())) > 3
    unthreaded = StreamingLoader(**loader_args(streamed), prefetch=False)  # reading ahead changes no batch
    assert torch.equal(epoch(unthreaded, 3), epoch(a, 3))


@pytest.mark.parametrize("group_rows", [16, 1000])  # many row groups; one per part (ranks share one)
def test_two_ranks_read_disjoint_rows_covering_the_epoch_in_equal_batch_counts(tmp_path, group_rows):
    memory, streamed = pair(tmp_path, group_rows=group_rows, batch_size=32, buffer=64)
    n = memory.splits.train.num_rows
    ranks = [StreamingLoader(**loader_args(streamed), rank=r, world_size=2) for r in (0, 1)]
    epochs = [[b.index for b in loader] for loader in ranks]
    assert len(epochs[0]) == len(epochs[1]) == len(ranks[0]) == len(ranks[1]) == (n // 2) // 32
    whole = [StreamingLoader(**loader_args(streamed), rank=r, world_size=2, drop_last=False) for r in (0, 1)]
    seen = [torch.cat([b.index for b in loader]) for loader in whole]
    assert len(seen[0]) == len(seen[1]) == n // 2
    assert not set(seen[0].tolist()) & set(seen[1].tolist())
    assert len(set(seen[0].tolist()) | set(seen[1].tolist())) == n - n % 2  # the remainder sits out


def loader_args(dm: SessionDataModule) -> dict:
    directory, manifest = dm.prepared
    return {"files": [directory / f for f in manifest["splits"]["train"]["files"]], "vocab": dm.vocab, "max_length": L,
            "batch_size": dm.batch_size, "shuffle_buffer": dm.shuffle_buffer or 65_536, "seed": dm.seed}


@pytest.mark.parametrize("k", [2, 12])  # while the buffer refills; after the split is read, in its drain
def test_a_loader_given_the_state_after_k_batches_yields_exactly_the_rest(tmp_path, k):
    _, streamed = pair(tmp_path, batch_size=32, buffer=64, augment_reversed=True)
    full = streamed.train_dataloader()
    full.set_epoch(2)
    expected = [(b.index, b.items) for b in full]
    full.set_epoch(2)
    it = iter(full)
    for _ in range(k):
        next(it)
    state = full.state_dict()
    assert state["epoch"] == 2 and state["position"] == k
    fresh = streamed.train_dataloader()
    fresh.load_state_dict(state)
    rest = [(b.index, b.items) for b in fresh]
    assert len(rest) == len(expected) - k > 0
    for (i, items), (j, want) in zip(rest, expected[k:]):
        assert torch.equal(i, j) and torch.equal(items, want)
    ended = streamed.train_dataloader()
    ended.load_state_dict({**state, "position": len(full)})
    ended._block = None  # an epoch resumed at its end reads no row group
    assert list(ended) == [] and ended.state_dict()["position"] == len(full)
    other = StreamingLoader(**{**loader_args(streamed), "batch_size": 16})
    with pytest.raises(ValueError, match="^the saved loader state has batch_size 32, this loader 16: resume with"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="^the saved loader state has no 'batch_size': it is not a StreamingLoader's"):
        fresh.load_state_dict({"epoch": 2, "position": k, "seed": 0})  # an in-memory SessionLoader's
    with pytest.raises(ValueError, match="^the saved loader state is a StreamingLoader's: resume with --data.streaming true"):
        SessionLoader(torch.ones(4, 2, dtype=torch.int32), batch_size=2, shuffle=True).load_state_dict(state)


def test_settings_the_streaming_path_cannot_honour_are_refused_in_one_line(tmp_path):
    splits = synthetic()
    directory = write_prepared(tmp_path / "p", splits, min_item_count=2)
    with pytest.raises(ValueError, match=r"^streaming reads a prepared dataset .*, but the source is SyntheticSource\(\); "):
        SessionDataModule(source=SyntheticSource(), streaming=True).vocab  # noqa: B018
    with pytest.raises(ValueError, match="^shuffle_buffer is the streaming loader's: set streaming true"):
        SessionDataModule(source=PreparedSource(str(directory)), shuffle_buffer=10)
    with pytest.raises(ValueError, match="^streaming reads the training split batch by batch: .*set device null"):
        SessionDataModule(source=PreparedSource(str(directory)), streaming=True, device="cpu")
    with pytest.raises(ValueError, match="^streaming reads the training split batch by batch: .*shuffle_chunk 1"):
        SessionDataModule(source=PreparedSource(str(directory)), streaming=True, shuffle_chunk=8)
    dm = SessionDataModule(source=PreparedSource(str(directory)), streaming=True)
    with pytest.raises(ValueError, match=r"/p: prepared with min_item_count 2, max_vocab_size None, but the data module has 1, None"):
        dm.vocab  # noqa: B018
    dm = SessionDataModule(source=PreparedSource(str(directory)), streaming=True, min_item_count=2, batch_size=8)
    assert len(dm.vocab) == len(ItemVocab.load(directory / "vocab.parquet"))
    with pytest.raises(ValueError, match=r"/p: the training split streams \(--data.streaming true\) and is not held in"):
        dm.tensors("train")
    assert dm.splits.valid.num_rows == splits.valid.num_rows
    assert dm.stats["train_sessions"] == splits.train.num_rows  # from the manifest
    side = SessionDataModule(source=PreparedSource(str(directory)), streaming=True, side_features=SideFeatures(position=4))
    with pytest.raises(ValueError, match="^streaming never holds the training split to fit the side features on: give"):
        side.side  # noqa: B018
    with pytest.raises(ValueError, match="^shuffle_buffer .32. must hold at least one batch .batch_size 64."):
        StreamingLoader(**{**loader_args(dm), "batch_size": 64, "shuffle_buffer": 32})
    bad = splits.train.set_column(1, "item_id", pa.array([["x"] * len(s) for s in splits.train.column("item_id").to_pylist()]))
    pq.write_table(bad, tmp_path / "bad.parquet", row_group_size=100)
    loader = StreamingLoader(**{**loader_args(dm), "files": [tmp_path / "bad.parquet"]})
    with pytest.raises(TypeError, match=r"^.*bad.parquet \(row group \d\), column 'item_id': item ids of type string cannot be"):
        next(iter(loader))  # raised in the reading thread, re-raised here
    part = directory / "train" / "part-00001.parquet"
    pq.write_table(splits.train.slice(0, 3), part)
    tampered = SessionDataModule(source=PreparedSource(str(directory)), streaming=True, min_item_count=2, batch_size=8)
    with pytest.raises(ValueError, match=r"part-00001.parquet: its content differs from the manifest's sha256 "):
        tampered.train_dataloader()
    pq.write_table(splits.train.slice(0, 3).drop_columns(["timestamp"]), part)
    with pytest.raises(ValueError, match=r"part-00001.parquet: its columns \(session_id int64, item_id list<element: int64>\) "
                                         r"differ from those of .*part-00000.parquet \(session_id .*, timestamp list<.*>\)$"):
        StreamingLoader(**loader_args(dm))
    pq.write_table(splits.train.slice(0, 3).rename_columns(["session_id", "item", "timestamp"]), part)
    with pytest.raises(ValueError, match=r"part-00001.parquet: no 'item_id' column \(it has \['session_id', 'item', 'time"):
        StreamingLoader(**loader_args(dm))


def test_a_part_replaced_between_epochs_is_refused_in_one_line(tmp_path):
    splits = synthetic()
    _, streamed = pair(tmp_path, splits, batch_size=32, buffer=64)
    loader = StreamingLoader(**loader_args(streamed), prefetch=False)
    assert len(list(loader)) == len(loader)
    part = tmp_path / "prepared" / "train" / "part-00001.parquet"  # another preparation written there
    pq.write_table(splits.train.slice(0, 40), part, row_group_size=16)
    with pytest.raises(ValueError, match=r"part-00001.parquet: replaced or changed since this loader read it \(another "
                                         r"sessrec prepare into the dataset\?\); a run reads one preparation"):
        list(loader)
    part.unlink()  # a part deleted between epochs
    with pytest.raises(ValueError, match=r"part-00001.parquet: a part of the prepared dataset is missing \(deleted, or "
                                         r"moved by another sessrec prepare\?\); prepare the dataset again$"):
        list(loader)


def task(dm: SessionDataModule) -> NextItemTask:
    torch.manual_seed(0)
    return NextItemTask(num_items=dm.num_items, max_length=L, encoder=m.GRU4RecEncoder(d_model=16, n_layer=1),
                        objective=m.CausalLanguageModeling())


class Seen(pl.Callback):
    """The sessions of every training batch; raises "killed" before step `killed_at` (a run killed there)."""

    def __init__(self, killed_at: int | None = None) -> None:
        self.batches: list[torch.Tensor] = []
        self.killed_at = killed_at

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == self.killed_at:
            raise RuntimeError("killed")
        self.batches.append(batch.index.clone())


def trainer(root: Path, seen: Seen, **kwargs) -> pl.Trainer:
    every = pl.callbacks.ModelCheckpoint(dirpath=root / "checkpoints", every_n_train_steps=3, save_last=True, save_top_k=0)
    return pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=root, callbacks=[seen, every], limit_val_batches=0, **kwargs)


def test_fit_trains_on_streamed_batches(tmp_path):
    _, streamed = pair(tmp_path, batch_size=32, buffer=64)
    fit = task(streamed)
    seen = Seen()
    pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False, fast_dev_run=2,
               callbacks=[seen], default_root_dir=tmp_path).fit(fit, datamodule=streamed)
    assert len(seen.batches) == 2 and fit.trainer.global_step == 2


@pytest.mark.slow
def test_a_fit_resumed_from_last_ckpt_mid_epoch_trains_on_exactly_the_batches_not_yet_seen(tmp_path):
    killed: list[Seen] = []

    def run(root: Path, **kwargs) -> Seen:
        _, streamed = pair(tmp_path, batch_size=32, buffer=64, augment_reversed=True)
        fit = task(streamed)
        seen = Seen(kwargs.pop("killed_at", None))
        killed.append(seen)
        ckpt = kwargs.pop("ckpt_path", None)
        trainer(root, seen, **kwargs).fit(fit, datamodule=streamed, ckpt_path=ckpt)
        return seen

    whole = run(tmp_path / "whole", max_epochs=2)
    per_epoch = len(whole.batches) // 2
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "cut", max_epochs=2, killed_at=per_epoch + 7)  # killed mid-epoch 1
    cut = killed[1]
    last = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=False)["global_step"]  # last.ckpt every 3 steps
    assert per_epoch < saved < per_epoch + 7 and saved % 3 == 0 and len(cut.batches) == per_epoch + 7
    resumed = run(tmp_path / "cut", max_epochs=2, ckpt_path=str(last))
    got = cut.batches[:saved] + resumed.batches  # the steps after the checkpoint are trained again
    assert len(got) == len(whole.batches) == 2 * per_epoch
    for a, b in zip(got, whole.batches):
        assert torch.equal(a, b)


class Written(pl.Callback):
    """Each rank's training sessions per epoch and final weights, written to `folder` (picklable for ddp_spawn)."""

    def __init__(self, folder: str) -> None:
        self.folder, self.rows = folder, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.rows.append((trainer.current_epoch, batch.index.tolist()))

    def on_train_end(self, trainer, pl_module) -> None:
        state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        torch.save({"rows": self.rows, "state": state}, f"{self.folder}/rank{trainer.global_rank}.pt")


@pytest.mark.slow
def test_two_ddp_processes_stream_their_own_sessions_in_step(tmp_path):
    """Uneven row groups (16 sessions, the last of each part shorter): the ranks still step alike and end equal."""
    memory, streamed = pair(tmp_path, batch_size=32, buffer=64)
    fit = task(streamed)
    pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=2, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
               callbacks=[Written(str(tmp_path))]).fit(fit, datamodule=streamed)
    first, second = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    n = memory.splits.train.num_rows
    for epoch in (0, 1):
        a = [i for e, rows in first["rows"] if e == epoch for i in rows]
        b = [i for e, rows in second["rows"] if e == epoch for i in rows]
        assert len(a) == len(b) == (n // 2) // 32 * 32 and not set(a) & set(b) and len(set(a)) == len(a)
    for name, value in first["state"].items():
        torch.testing.assert_close(second["state"][name], value, rtol=0, atol=0, msg=name)
