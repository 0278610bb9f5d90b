"""`TrivagoSource` on the real trivago_rsc19_100k file (counts from its SOURCE.md), clear errors on
bad logs, and the side-feature transforms' round trip through ``sessrec fit`` -> ``sessrec predict``."""

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.cli import cli as main
from sessrec.data import EventLogSource, SchemaError, SideFeatures, frame
from sessrec.datasets import TrivagoSource
from sessrec.datasets.trivago import SCHEMA
from sessrec.features import SideFeatureTransform
from sessrec.tasks import SessionDataModule

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
FILE = "trivago_val_100k.parquet.snappy"


@pytest.fixture(scope="module")
def real(shared_data):
    return str(shared_data("trivago_rsc19_100k") / FILE)


def test_reader_counts_match_source_md(real):
    events = TrivagoSource(real, virtual_items=True, features=["price"]).events()
    assert events.num_rows == 100_003
    assert pc.count_distinct(events.column("session_id")).as_py() == 7_612
    product = ~events.column("virtual").to_numpy(zero_copy_only=False)
    items = events.column("item_id").filter(pa.array(product))
    assert len(items) == 87_612 and pc.count_distinct(items).as_py() == 13_950
    t = events.column("timestamp").to_numpy()
    assert (t.min(), t.max()) == (1_541_548_939, 1_541_721_582)  # 2018-11-07 00:02:19 - 2018-11-08 23:59:42 UTC
    keys = events.column("item_id").filter(pa.array(~product))
    assert "filter selection:4 Star" in set(keys.to_pylist()) and len(keys) == 100_003 - 87_612
    # sorted by session, then time, then step
    sid = events.column("session_id").to_numpy(zero_copy_only=False)
    step = events.column("step").to_numpy()
    same = sid[1:] == sid[:-1]
    assert (sid[1:] >= sid[:-1]).all()
    assert ((t[1:] > t[:-1]) | ((t[1:] == t[:-1]) & (step[1:] >= step[:-1])) | ~same).all()
    # the clicked hotel's price: every click-out but one finds its hotel among the impressions
    price = events.column("price").to_numpy(zero_copy_only=False)
    assert np.isfinite(price).sum() == 13_596
    first = pq.read_table(real).slice(0, 3)  # SOURCE.md's sample: 5967314 is shown third at price 119
    assert first.column("session_id")[2].as_py() == "82cafdca18b3c"
    item = events.column("item_id").to_numpy(zero_copy_only=False)
    clicked = np.flatnonzero((sid == "82cafdca18b3c") & (item == "5967314") & np.isfinite(price))
    assert price[clicked].tolist() == [119.0]


def test_split_by_session_start_and_the_same_pairs_with_or_without_virtual_items(real):
    all_events = TrivagoSource(real, virtual_items=True, min_products=0).load()
    assert sum(getattr(all_events, s).num_rows for s in ("train", "valid", "test")) == 7_612
    assert sum(frame.session_lengths(getattr(all_events, s)).sum() for s in ("train", "valid", "test")) == 100_003
    end = 1_541_721_582
    for split, (lo, hi) in {"train": (-np.inf, end - 16 * 3600), "valid": (end - 16 * 3600, end - 8 * 3600), "test": (end - 8 * 3600, end)}.items():
        values, offsets = frame.list_offsets(getattr(all_events, split).column("timestamp"))
        start = values.to_numpy()[offsets[:-1]]
        assert ((start > lo) & (start <= hi)).all(), split

    plain = SessionDataModule(source=TrivagoSource(real), eval_protocol="last")
    virtual = SessionDataModule(source=TrivagoSource(real, virtual_items=True), eval_protocol="last")
    assert virtual.num_virtual > 0 and plain.num_virtual == 0
    for split in ("valid", "test"):
        a, b = getattr(plain.splits, split), getattr(virtual.splits, split)
        assert a.column("session_id").equals(b.column("session_id"))
        ta, tb = plain.tensors(split)[1], virtual.tensors(split)[1]
        assert plain.decode(ta).equals(virtual.decode(tb))  # the same products are predicted (OOV -> null)
        assert (tb < virtual.num_items - virtual.num_virtual).all()
    assert plain.stats["test_pairs"] == 916 == virtual.stats["test_pairs"]


# ------------------------------------------------------------------------ a small fake log


def fake_log(path: Path, n_sessions: int = 240, seed: int = 0, drop: str | None = None, bad_price: bool = False) -> Path:
    """A trivago-format log: destination search, image views, an optional filter, a click-out."""
    rng = np.random.default_rng(seed)
    rows = {c: [] for c in ("user_id", "session_id", "timestamp", "step", "action_type", "reference", "platform",
                            "city", "device", "current_filters", "impressions", "prices")}
    for s in range(n_sessions):
        city = int(rng.integers(0, 4))
        hotels = 1000 + city * 12 + rng.integers(0, 12, size=int(rng.integers(2, 6)))
        events = [("search for destination", f"City {city}, X")]
        events += [("interaction item image", str(h)) for h in hotels[:-1]]
        if s % 2:
            events.append(("filter selection", "4 Star"))
        events.append(("clickout item", str(hotels[0])))
        t = 1_541_548_800 + int(s * 2 * 86_400 / n_sessions)
        for step, (action, ref) in enumerate(events, start=1):
            t += int(rng.integers(1, 90))
            shown = [str(1000 + city * 12 + k) for k in range(12)]
            click = action == "clickout item"
            values = {
                "user_id": f"u{s % 50}", "session_id": f"s{s:04d}", "timestamp": t, "step": step, "action_type": action,
                "reference": ref, "platform": ["DE", "US", "BR"][s % 3], "city": f"City {city}, X",
                "device": ["mobile", "desktop"][s % 2], "current_filters": "4 Star" if s % 2 and step > 2 else None,
                "impressions": "|".join(shown) if click else None,
                "prices": "|".join(("x" if bad_price and k == 3 else str(50 + 10 * k)) for k in range(12)) if click else None,
            }
            for c, v in values.items():
                rows[c].append(v)
    table = pa.table(rows)
    if drop:
        table = table.drop_columns([drop])
    pq.write_table(table, path)
    return path


def test_bad_logs_give_clear_errors(tmp_path):
    path = fake_log(tmp_path / "log.parquet", drop="device")
    with pytest.raises(SchemaError, match=r"log.parquet: column 'device' is missing; the file has columns"):
        TrivagoSource(str(path), features=["device"]).load()
    path = fake_log(tmp_path / "log.parquet")
    with pytest.raises(SchemaError, match=r"log.parquet: column 'colour' is missing"):
        TrivagoSource(str(path), features=["colour"]).load()
    schema = replace(SCHEMA, virtual=replace(SCHEMA.virtual, key=["action_type", "weather"]))
    with pytest.raises(SchemaError, match=r"log.parquet: column 'weather' is missing"):
        EventLogSource(str(path), schema=schema, test_days=0.1).load()
    # current_filters is null on most events: refused as a categorical feature unless nulls are padded
    dm = SessionDataModule(
        source=TrivagoSource(str(path), features=["current_filters"]),
        side_features=SideFeatures(categorical=["current_filters"]),
    )
    with pytest.raises(SchemaError, match=r"log.parquet.*column 'current_filters' has a null value \(None\) at event 0 of session 's0000'"):
        dm.tensors("train")
    path = fake_log(tmp_path / "bad.parquet", bad_price=True)
    with pytest.raises(SchemaError, match=r"bad.parquet: column 'prices' holds a value that is not a number"):
        TrivagoSource(str(path), features=["price"]).load()
    table = pq.read_table(fake_log(tmp_path / "log.parquet"))
    prices = table.column("prices").to_pylist()
    row = next(i for i, v in enumerate(prices) if v)
    prices[row] = prices[row] + "|99"
    pq.write_table(table.set_column(table.column_names.index("prices"), "prices", pa.array(prices)), tmp_path / "ragged.parquet")
    with pytest.raises(SchemaError, match=rf"ragged.parquet: columns 'impressions' and 'prices' differ in length at row {row}"):
        TrivagoSource(str(tmp_path / "ragged.parquet"), features=["price"]).load()


def test_clicked_price_of_a_csv_of_one_hotel_lists(tmp_path):
    from test_ranking_data import ONE_HOTEL_CSV

    path = tmp_path / "one.csv"
    path.write_text(ONE_HOTEL_CSV)
    events = TrivagoSource(str(path), features=["price"]).events()
    assert events.column("price").to_pylist() == [None, 60.5, None]  # b's clicked hotel was not shown


TINY = [
    "--config", str(ROOT / "recipes" / "xlnet_mlm_trivago_side.yaml"),
    "--trainer.max_epochs", "2",
    "--trainer.enable_progress_bar", "false",
    "--trainer.logger", "false",
    "--data.source.init_args.virtual_items", "true",
    "--data.source.init_args.test_hours", "10",
    "--data.source.init_args.valid_hours", "10",
    "--data.batch_size", "32",
    "--model.encoder.init_args.d_model", "16",
    "--model.encoder.init_args.n_head", "2",
]


@pytest.mark.slow
def test_fitted_side_features_round_trip_through_predict(tmp_path, monkeypatch):
    log = fake_log(tmp_path / "log.parquet")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    args = [*TINY, "--data.source.init_args.path", str(log)]
    fitted = main(["fit", *args])
    dm = fitted.datamodule
    model_dir = work / "runs" / "xlnet_mlm_trivago_side" / "model"
    assert (model_dir / "features.npz").exists() and (model_dir / "vocab.parquet").exists()
    assert dm.num_virtual > 0 and dm.side_info.categorical["action_type"] == 2 + 4  # 4 action types in training

    # the saved transforms reproduce the training-time ones exactly
    loaded = SideFeatureTransform.load(model_dir / "features.npz", dm.side_features)
    test = dm.splits.test
    a, b = dm.side.transform(test), loaded.transform(test)
    assert set(a) == {"action_type", "device", "platform", "position", "price", "since_prev", "dwell"}
    assert all(np.array_equal(a[k], b[k]) for k in a)

    # score the held-out sessions (one event per row) with `sessrec predict` ...
    values, offsets = frame.list_offsets(test.column("item_id"))
    lengths = np.diff(offsets)
    events = {"session_id": np.repeat(test.column("session_id").to_numpy(zero_copy_only=False), lengths), "item_id": values}
    for name in ("timestamp", "virtual", "action_type", "device", "platform", "price"):
        events[name] = frame.list_offsets(test.column(name))[0]
    src, out = tmp_path / "events.parquet", tmp_path / "recs.parquet"
    pq.write_table(pa.table(events), src)
    predicted = main(["predict", *args, "--model_dir", str(model_dir), "--data.predict_path", str(src),
                      "--data.predict_schema.timestamp", "timestamp", "--scoring.output", str(out)])
    assert predicted.datamodule.features_path == str(model_dir / "features.npz")  # the model's fitted transforms
    recs = pq.read_table(out)
    assert recs.column("session_id").to_pylist() == test.column("session_id").to_pylist()

    # ... which matches scoring them directly with the training-time transforms and the model directory's weights
    model = predicted.model.eval()
    virtual = frame.list_offsets(test.column("virtual"))[0].to_numpy(zero_copy_only=False)
    pad = lambda v: torch.from_numpy(frame.pad_sessions(v, offsets[:-1], offsets[1:], dm.max_length))
    items = pad(dm.vocab.encode(values, virtual=virtual).ids)
    width = int((items != 0).sum(dim=1).max())  # one scoring batch, trimmed like the stream trims it
    items = items[:, -width:]
    feats = {k: pad(v)[:, -width:] for k, v in a.items()}
    with torch.no_grad():
        top = model.model(items, model.objective, feats).topk(20, dim=1).indices
        blind = model.model(items, model.objective, {k: torch.zeros_like(v) for k, v in feats.items()}).topk(20, dim=1).indices
    expected = dm.vocab.decode(top.numpy()).to_pylist()
    got = [i for row in recs.column("item_ids").to_pylist() for i in row]
    assert got == expected
    assert not torch.equal(top, blind)  # the features matter, so a wrong transform would show
    assert not set(got) & set(dm.vocab.raw_ids.slice(dm.vocab.num_products).to_pylist())  # no virtual item recommended

    # the model directory is all predict needs: the checkpoints may be gone
    for path in (work / "runs" / "xlnet_mlm_trivago_side" / "checkpoints").iterdir():
        os.remove(path)
    main(["predict", *args, "--model_dir", str(model_dir), "--data.predict_path", str(src),
          "--data.predict_schema.timestamp", "timestamp", "--scoring.output", str(tmp_path / "r2.parquet")])
    assert pq.read_table(tmp_path / "r2.parquet").equals(pq.read_table(out))
