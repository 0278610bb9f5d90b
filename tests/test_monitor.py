"""`sessrec monitor`: a served log joined with the events that followed, per version and window; thresholds;
one-line errors; and, end to end, the hit rate ``sessrec test`` gives for the same sessions."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import yaml

from sessrec.cli import main, run
from sessrec.data import ItemVocab, Schema
from sessrec.lifecycle.monitor import PSI_FLOOR, CanaryWorse, Thresholds, monitor, psi
from sessrec.serving.served_log import ServedLog, served_files

DAY = 86400.0
T0 = 19676 * DAY  # 2023-11-15T00:00Z


def events_csv(path: Path) -> Path:
    """Sessions s1 (10, 11, 12), s2 (99, 10), s3 (13, 12), s4 (10, 11), s5 (12, 13), written out of order."""
    rows = [("s1", 12, 3), ("s1", 10, 1), ("s1", 11, 2), ("s2", 99, 5), ("s2", 10, 6), ("s3", 13, 7), ("s3", 12, 8),
            ("s4", 10, 9), ("s4", 11, 10), ("s5", 12, DAY + 1), ("s5", 13, DAY + 2)]
    table = pa.table({"sid": [r[0] for r in rows], "item": [r[1] for r in rows], "t": [T0 + r[2] for r in rows]})
    pacsv.write_csv(table, path)
    return path


def reference(path: Path) -> Path:
    """A prepared dataset's vocabulary: items 10, 11, 12, 13 seen 4, 3, 2, 1 times in training."""
    ItemVocab.fit(pa.array([10] * 4 + [11] * 3 + [12] * 2 + [13])).save(path / "vocab.parquet")
    return path


def served(directory: Path, day_2: bool = False) -> Path:
    """Six requests of v000001 on day 0, one of v000002 on day 1 (k = 2 items each); `day_2`: and one of v000002 on
    day 2 at the end of session s5 (no next event)."""
    requests = [  # (session, its events so far, recommended, time)
        ("s1", [10], [11, 13], 1),  # next 11: rank 1
        ("s1", [10, 11], [10, 12], 2),  # next 12: rank 2
        ("s1", [10, 11, 12], [10, 11], 3),  # the session ended
        ("s2", [99], [10, 11], 5),  # an unknown item; next 10: rank 1
        ("s3", [13], [10, 11], 7),  # next 12: a miss
        ("s4", [11], [10, 11], 9),  # the event log's s4 starts with 10: unmatched
    ]
    with ServedLog(directory) as log:
        for i, (session, items, recommended, t) in enumerate(requests):
            log.record(f"r{i}", [items], [{"item_ids": recommended, "scores": [2.0, 1.0]}], "v000001",
                       now=[T0 + t], session_ids=[session])
        log.record("r6", [[12]], [{"item_ids": [13, 10], "scores": [2.0, 1.0]}], "v000002", now=[T0 + DAY + 1],
                   session_ids=["s5"])
        if day_2:
            log.record("r7", [[12, 13]], [{"item_ids": [10, 11], "scores": [2.0, 1.0]}], "v000002", now=[T0 + 2 * DAY + 1],
                       session_ids=["s5"])
    return directory


SCHEMA = Schema(session_id="sid", item_id="item", timestamp="t")


@pytest.fixture
def inputs(tmp_path: Path) -> dict:
    (tmp_path / "log").mkdir()
    (tmp_path / "ref").mkdir()
    return {"served_log": str(served(tmp_path / "log")), "paths": [str(events_csv(tmp_path / "events.csv"))],
            "reference": str(reference(tmp_path / "ref")), "schema": SCHEMA, "k": 2, "psi_bins": 2}


def test_metrics_per_version_and_window(inputs: dict, tmp_path: Path, capsys) -> None:
    table = monitor(out=str(tmp_path / "m.csv"), **inputs)
    rows = table.to_pylist()
    assert [(r["model_version"], r["window_start"].timestamp()) for r in rows] == [("v000001", T0), ("v000002", T0 + DAY)]
    first, second = rows
    assert (first["requests"], first["evaluated"], first["unmatched"], first["ended"]) == (6, 4, 1, 1)
    assert first["hit_rate@2"] == pytest.approx(3 / 4) and first["mrr@2"] == pytest.approx((1 + 1 / 2 + 1 + 0) / 4)
    assert first["coverage@2"] == 1.0 and first["unknown_share"] == pytest.approx(1 / 6)
    # bins of equal training mass: {10, 11} (0.7), {12, 13} (0.3); newest known items 10 11 12 13 11 (99 is unknown)
    p, q = np.array([0.7, 0.3]), np.array([3, 2]) / 5
    assert first["psi"] == pytest.approx(float(np.sum((q - p) * np.log(q / p))))
    # day 1: only 12, of the second bin; the first bin's empty share counts as PSI_FLOOR
    p, q = np.array([0.7, 0.3]), np.array([PSI_FLOOR, 1.0])
    assert second["psi"] == pytest.approx(float(np.sum((q - p) * np.log(q / p)))) == psi(np.array([7, 3]), np.array([0, 1]))
    assert (second["requests"], second["evaluated"], second["hit_rate@2"], second["mrr@2"]) == (1, 1, 1.0, 1.0)
    assert second["coverage@2"] == 0.5 and second["unknown_share"] == 0.0
    assert pacsv.read_csv(tmp_path / "m.csv").column("evaluated").to_pylist() == [4, 1]
    assert "v000002" in capsys.readouterr().out


def test_coverage_counts_only_the_reference_products_so_a_grown_vocabulary_keeps_it_a_share(tmp_path: Path) -> None:
    """A retrained version recommends 20 and 21, which the reference (10..13) lacks: coverage@2 is the share of the
    reference's 4 products recommended (10, 11: 0.5), not 4 distinct items / 4 products."""
    with ServedLog(tmp_path / "log") as log:
        for i, (items, recommended) in enumerate([([10], [11, 20]), ([10, 11], [10, 21])]):
            log.record(f"r{i}", [items], [{"item_ids": recommended, "scores": [2.0, 1.0]}], "v000003", now=[T0 + 1 + i],
                       session_ids=["s1"])
    (tmp_path / "ref").mkdir()
    table = monitor(str(tmp_path / "log"), [str(events_csv(tmp_path / "events.csv"))], str(reference(tmp_path / "ref")),
                    str(tmp_path / "m.csv"), SCHEMA, k=2, psi_bins=2)
    assert table.column("coverage@2").to_pylist() == [0.5]


def test_a_request_that_did_not_start_at_the_sessions_first_event_is_unmatched_even_when_its_last_item_repeats(
        tmp_path: Path) -> None:
    """Session s7 is 10, 11, 12, 11, 13. A request carrying its events 3 and 4 (12, 11) was matched on its last item
    alone (the log's event 2 is 11 too) and judged on event 3 (12) as the next one, which was the request's own."""
    rows = [("s7", item, 20 + i) for i, item in enumerate([10, 11, 12, 11, 13])]
    pacsv.write_csv(pa.table({"sid": [r[0] for r in rows], "item": [r[1] for r in rows], "t": [T0 + r[2] for r in rows]}),
                    tmp_path / "events.csv")
    with ServedLog(tmp_path / "log") as log:
        log.record("late", [[12, 11]], [{"item_ids": [12, 10], "scores": [2.0, 1.0]}], "v000001", now=[T0 + 23],
                   session_ids=["s7"])  # its next event is 13: a miss, but it is no request from the session's start
        log.record("whole", [[10, 11, 12, 11]], [{"item_ids": [10, 12], "scores": [2.0, 1.0]}], "v000001",
                   now=[T0 + 23], session_ids=["s7"])  # next 13: a miss
    (tmp_path / "ref").mkdir()
    table = monitor(str(tmp_path / "log"), [str(tmp_path / "events.csv")], str(reference(tmp_path / "ref")),
                    str(tmp_path / "m.csv"), SCHEMA, k=2, psi_bins=2)
    (row,) = table.to_pylist()
    assert (row["requests"], row["evaluated"], row["unmatched"], row["hit_rate@2"], row["mrr@2"]) == (2, 1, 1, 0.0, 0.0)


def test_one_version_name_served_by_two_models_is_refused(tmp_path: Path) -> None:
    """Two servers of two model directories log into one folder, each at its version v000001: the rows of both would
    be one version's figures. Rows without a hash (a recommender served without its directory) are not counted."""
    for model_hash in ("sha256:" + "a" * 64, "sha256:" + "b" * 64, None):
        with ServedLog(tmp_path / "log") as log:
            log.record("r", [[10]], [{"item_ids": [11, 13], "scores": [2.0, 1.0]}], "v000001", now=[T0 + 1],
                       session_ids=["s1"], model_hash=model_hash)
    (tmp_path / "ref").mkdir()
    first, second = sorted(served_files(tmp_path / "log"), key=lambda f: pq.read_table(f).column("model_hash")[0].as_py() or "")[1:]
    with pytest.raises(ValueError) as err:
        monitor(str(tmp_path / "log"), [str(events_csv(tmp_path / "events.csv"))], str(reference(tmp_path / "ref")),
                str(tmp_path / "m.csv"), SCHEMA, k=2, psi_bins=2)
    assert str(err.value) == (f"{tmp_path / 'log'}: version v000001 was served by two models (sha256:aaaaaaaaaaaa... in "
                              f"{first.name}, sha256:bbbbbbbbbbbb... in {second.name}): servers of two model directories "
                              "write this served log; give each its own --served-log")
    assert not (tmp_path / "m.csv").exists()


def test_a_period_and_the_versions_select_rows(inputs: dict, tmp_path: Path) -> None:
    table = monitor(out=str(tmp_path / "m.parquet"), since="2023-11-15", until="2023-11-16", **inputs)
    assert table.column("model_version").to_pylist() == ["v000001"]
    assert pq.read_table(tmp_path / "m.parquet").equals(table)
    assert monitor(out=str(tmp_path / "m.csv"), versions=["v000002"], **inputs).column("requests").to_pylist() == [1]


def test_a_plot_without_matplotlib_is_refused_before_anything_is_written(inputs: dict, tmp_path: Path,
                                                                        monkeypatch) -> None:
    """Without the dev extra, --plot failed after the table was written, with status 1 where a crossed psi_max says 3:
    the chain retrained nothing and the table of a failed run stayed. Refused before anything is read."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    with pytest.raises(ModuleNotFoundError) as err:
        monitor(out=str(tmp_path / "m.csv"), plot=str(tmp_path / "m.png"), thresholds=Thresholds(psi_max=1.0), **inputs)
    assert err.value.name == "matplotlib"
    assert not (tmp_path / "m.csv").exists() and not (tmp_path / "m.png").exists()


def test_a_plot_is_drawn(inputs: dict, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    monitor(out=str(tmp_path / "m.csv"), plot=str(tmp_path / "m.png"), **inputs)
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def cli_args(inputs: dict, tmp_path: Path, thresholds: dict, overwrite: bool = False) -> list[str]:
    recipe = {**inputs, "schema": {"session_id": "sid", "item_id": "item", "timestamp": "t"},
              "out": str(tmp_path / "m.csv"), "thresholds": thresholds}
    path = tmp_path / "monitor.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return ["monitor", "--config", str(path), *(["--overwrite", "true"] if overwrite else [])]


def test_a_threshold_crossed_exits_3_with_one_line(inputs: dict, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["sessrec", *cli_args(inputs, tmp_path, {"psi_max": 1.0, "hit_rate_min": 0.5})])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 3
    err = capsys.readouterr().err.strip()
    assert err == ("sessrec monitor: threshold crossed: psi 7.0395 > psi_max 1 (version v000002, window from "
                   "2023-11-16T00:00Z)")
    assert (tmp_path / "m.csv").exists()  # the table is written first
    assert run(cli_args(inputs, tmp_path, {"psi_max": 10.0, "hit_rate_min": 0.5}, overwrite=True)).num_rows == 2  # none crossed


def test_a_window_without_a_judged_request_is_reported_and_crosses_nothing(inputs: dict, tmp_path: Path, capsys,
                                                                           monkeypatch) -> None:
    """Day 2 holds one request of a session that ended with it (s5's last event): a window of no judged request,
    counts 0 and NaN rates marked in the printout; it crosses no threshold, while another window's psi still does."""
    (tmp_path / "log_2").mkdir()
    inputs = {**inputs, "served_log": str(served(tmp_path / "log_2", day_2=True))}
    table = run(cli_args(inputs, tmp_path, {"psi_max": 10.0, "hit_rate_min": 0.5, "mrr_min": 0.5}))
    last = table.to_pylist()[-1]
    assert (last["window_start"].timestamp(), last["requests"], last["evaluated"], last["ended"]) == (T0 + 2 * DAY, 1, 0, 1)
    assert np.isnan(last["hit_rate@2"]) and np.isnan(last["mrr@2"])
    out = capsys.readouterr().out
    assert "version v000002, window from 2023-11-17T00:00Z: no request with a next event; hit_rate@2 and mrr@2 not judged" in out
    monkeypatch.setattr(sys, "argv", ["sessrec", *cli_args(inputs, tmp_path, {"psi_max": 1.0, "hit_rate_min": 0.5},
                                                            overwrite=True)])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 3
    assert capsys.readouterr().err.startswith("sessrec monitor: threshold crossed: psi 7.0395 > psi_max 1 (version v000002")


def test_a_misspelt_threshold_is_one_line_naming_its_place(inputs: dict, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["sessrec", *cli_args(inputs, tmp_path, {"psi_mx": 1.0})])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert re.fullmatch(rf"sessrec monitor: error: {re.escape(str(tmp_path / 'monitor.yaml'))}:13:3: unknown key "
                        r"thresholds.psi_mx \(Thresholds has no option 'psi_mx'\); did you mean thresholds.psi_max\? "
                        r"\(--traceback for details\)", exit_.value.code)
    assert not (tmp_path / "m.csv").exists()


def test_thresholds_check_each_side() -> None:
    table = pa.table({"model_version": ["v1"], "window_start": pa.array([int(T0 * 1e6)], pa.timestamp("us", tz="UTC")),
                      "evaluated": [3], "hit_rate@5": [0.2], "mrr@5": [0.1], "coverage@5": [0.5],
                      "unknown_share": [0.3], "psi": [0.05]})
    assert Thresholds(hit_rate_min=0.1, mrr_min=0.1, psi_max=0.05).crossed(table, 5) == []
    reasons = Thresholds(hit_rate_min=0.25, unknown_max=0.2, coverage_min=0.4).crossed(table, 5)
    assert [r.split(" (")[0] for r in reasons] == ["hit_rate@5 0.2000 < hit_rate_min 0.25", "unknown_share 0.3000 > unknown_max 0.2"]
    all_new = table.set_column(7, "psi", pa.array([float("nan")]))
    assert Thresholds(psi_max=10.0).crossed(all_new, 5) == [
        "psi undefined: no requested item is in the training vocabulary (version v1, window from 2023-11-15T00:00Z)"]
    half_minutes = pa.concat_tables([table, table]).set_column(  # windows of 30 s: each named to its second
        1, "window_start", pa.array([int(T0 * 1e6), int((T0 + 30) * 1e6)], pa.timestamp("us", tz="UTC")))
    assert [r.split(" (")[1] for r in Thresholds(unknown_max=0.2).crossed(half_minutes, 5)] == [
        "version v1, window from 2023-11-15T00:00Z)", "version v1, window from 2023-11-15T00:00:30Z)"]
    unjudged = table.set_column(2, "evaluated", pa.array([0])).set_column(3, "hit_rate@5", pa.array([float("nan")]))
    with pytest.raises(ValueError, match=r"^no served request has a next event in the event log, so hit_rate_min cannot"):
        Thresholds(hit_rate_min=0.1).crossed(unjudged, 5)
    assert Thresholds(hit_rate_min=0.1).crossed(pa.concat_tables([table, unjudged]), 5) == []


@pytest.mark.parametrize(("given", "message"), [
    ({"hit_rate_min": 1.5}, "thresholds hit_rate_min must be a number in (0, 1], got 1.5"),
    ({"mrr_min": 0.0}, "thresholds mrr_min must be a number in (0, 1], got 0.0"),
    ({"coverage_min": -0.1}, "thresholds coverage_min must be a number in (0, 1], got -0.1"),
    ({"unknown_max": 1.0}, "thresholds unknown_max must be a number in [0, 1), got 1.0"),
    ({"psi_max": -1.0}, "thresholds psi_max must be a finite number > 0, got -1.0"),
    ({"psi_max": 0.0}, "thresholds psi_max must be a finite number > 0, got 0.0"),
])
def test_a_threshold_no_window_can_meet_or_every_window_meets_is_refused(given: dict, message: str) -> None:
    """A limit that every window crosses (the documented chain would retrain every day) or none can: refused."""
    with pytest.raises(ValueError) as err:
        Thresholds(**given)
    assert str(err.value) == message


def test_bad_inputs_are_one_line_naming_file_column_or_value(inputs: dict, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"{empty}: no served log files"):
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "served_log": str(empty)})
    with pytest.raises(ValueError, match=r"events.csv: column 'session' is missing; the file has columns \['sid'"):
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "schema": Schema(session_id="session", item_id="item", timestamp="t")})
    with pytest.raises(ValueError, match=r"log: version 'v000002' has no rows between 2023-11-15 and 2023-11-16; "
                                         "versions with rows: v000001"):
        monitor(out=str(tmp_path / "m.csv"), since="2023-11-15", until="2023-11-16", versions=["v000002"], **inputs)
    with pytest.raises(ValueError, match=r"since 2023-12-01 is not before until 2023-11-01: the period \[since, until\) holds no time"):
        monitor(out=str(tmp_path / "m.csv"), since="2023-12-01", until="2023-11-01", **inputs)
    assert not (tmp_path / "m.csv").exists()
    with pytest.raises(ValueError, match="request r0 was answered with 2 items, fewer than k=3"):
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "k": 3})
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/vocab.parquet: no vocabulary; reference must be"):
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "reference": str(tmp_path)})
    must = ("reference must be a model directory (sessrec fit) or a prepared dataset folder holding vocab.parquet "
            "(sessrec prepare)")
    vocab = f"{inputs['reference']}/vocab.parquet"
    with pytest.raises(NotADirectoryError, match=f"^{re.escape(f'{vocab}: a file, not a folder; {must}')}$"):
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "reference": vocab})
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(f'{tmp_path}/none: no such folder; {must}')}$"):
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "reference": str(tmp_path / "none")})
    with pytest.raises(ValueError, match="out must end in .csv or .parquet, got m.txt"):
        monitor(out="m.txt", **inputs)
    with pytest.raises(ValueError, match=r"^monitor: versions is an empty list; name at least one version, or leave "
                                         "it out for every version served$"):
        monitor(out=str(tmp_path / "m.csv"), versions=[], **inputs)  # not an empty table and exit 0
    assert not (tmp_path / "m.csv").exists()


@pytest.mark.parametrize("damage", ["truncated", "empty", "flipped"])
def test_a_damaged_served_log_file_is_one_line_naming_it(inputs: dict, tmp_path: Path, damage: str) -> None:
    """A closed file cut short, emptied or with bytes flipped in a page (a disk or a copy that damaged it): pyarrow's
    message alone named no file, so the user could not tell which of the folder's files to move away."""
    (good,) = Path(inputs["served_log"]).glob("served-*.parquet")
    data = bytearray(good.read_bytes())
    if damage == "flipped":
        data[100:400] = bytes(b ^ 0xFF for b in data[100:400])
    bad = good.with_name("served-20991231T000000Z-1-000009.parquet")
    bad.write_bytes({"truncated": bytes(data[:300]), "empty": b"", "flipped": bytes(data)}[damage])
    with pytest.raises(ValueError) as err:
        monitor(out=str(tmp_path / "m.csv"), **inputs)
    assert re.fullmatch(rf"{re.escape(str(bad))}: a served log file that cannot be read \(.+\); a closed file is renamed "
                        "complete, so it was damaged after: move it out of the folder to monitor the others",
                        str(err.value))
    assert not (tmp_path / "m.csv").exists()
    bad.unlink()
    assert monitor(out=str(tmp_path / "m.csv"), **inputs).column("requests").to_pylist() == [6, 1]


def test_event_files_that_overlap_are_refused_and_files_that_split_the_log_give_its_values(inputs: dict,
                                                                                           tmp_path: Path) -> None:
    """The event log given as the same file twice, or as two exports that share events: every event read twice
    shifted the positions, so that a one-event request was judged on its own item as the next one, and the rest were
    unmatched: hit rate@2 0.0 (3 of 6 judged) where it is 0.75, exit 0. Two files that split it (at a time inside
    session s1) give the values of the one file."""
    events = inputs["paths"][0]
    copy = tmp_path / "copy.csv"
    copy.write_bytes(Path(events).read_bytes())
    with pytest.raises(ValueError) as err:
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "paths": [events, f"{tmp_path}/x/../events.csv"]})
    assert str(err.value) == (f"monitor: paths names the event file {events} twice ({tmp_path}/x/../events.csv): its "
                              "events would be read twice, and every session's positions would shift")
    with pytest.raises(ValueError) as err:
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "paths": [events, str(copy)]})
    assert re.fullmatch(rf"{re.escape(str(copy))}: holds events that {re.escape(events)} holds too \(11 of them, one: "
                        r"sid 's\d', item '\d+', t '\d+'\): event files that overlap would read their events twice and "
                        "shift every session's positions; give each event once", str(err.value))
    assert not (tmp_path / "m.csv").exists()
    log = pacsv.read_csv(events)
    early = pc.less(log.column("t"), T0 + 2.5)  # s1's events 10, 11 in one file, its 12 in the other
    pacsv.write_csv(log.filter(early), tmp_path / "a.csv")
    pacsv.write_csv(log.filter(pc.invert(early)), tmp_path / "b.csv")
    whole = monitor(out=str(tmp_path / "m.csv"), **inputs)
    split = monitor(out=str(tmp_path / "s.csv"), **{**inputs, "paths": [str(tmp_path / "b.csv"), str(tmp_path / "a.csv")]})
    assert split.equals(whole) and split.column("hit_rate@2").to_pylist() == [0.75, 1.0]


def test_an_answer_shorter_than_the_k_asked_for_is_judged_and_a_smaller_k_asked_for_is_refused(inputs: dict,
                                                                                               tmp_path: Path) -> None:
    """A pipeline with fewer candidates than k answers a shorter list: the whole log was refused ("answered with 1
    items, fewer than k=2; monitor with a k of at most the k served", though the k served was 2), so no day with one
    such answer could be monitored. The row records the k asked for: a short answer to k=2 is judged at k=2 (s1's
    next item 11 is its one item: a hit; s3's next 12 is not: a miss), and a request that asked for k=1 is refused
    at k=2, whose hits at rank 2 it could not have."""
    with ServedLog(tmp_path / "short") as log:
        log.record("short", [[10]], [{"item_ids": [11], "scores": [1.0]}], "v000001", now=[T0 + 1], session_ids=["s1"], k=2)
        log.record("miss", [[13]], [{"item_ids": [10], "scores": [1.0]}], "v000001", now=[T0 + 7], session_ids=["s3"], k=2)
    (row,) = monitor(out=str(tmp_path / "m.csv"), **{**inputs, "served_log": str(tmp_path / "short")}).to_pylist()
    assert (row["requests"], row["evaluated"], row["hit_rate@2"], row["mrr@2"]) == (2, 2, 0.5, 0.5)
    with ServedLog(tmp_path / "short") as log:
        log.record("one", [[10, 11]], [{"item_ids": [12], "scores": [1.0]}], "v000001", now=[T0 + 2],
                   session_ids=["s1"], k=1)
    with pytest.raises(ValueError) as err:
        monitor(out=str(tmp_path / "m2.csv"), **{**inputs, "served_log": str(tmp_path / "short")})
    assert str(err.value) == (f"{tmp_path / 'short'}: request one asked for k=1, fewer than k=2; monitor with a k of at "
                              "most the k served")
    assert pq.read_table(served_files(tmp_path / "short")[0]).column("k").to_pylist() == [2, 2]


def test_a_served_log_file_without_the_k_column_is_refused_naming_it(inputs: dict, tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    for f in served_files(inputs["served_log"]):
        pq.write_table(pq.read_table(f).drop_columns(["k"]), tmp_path / "old" / f.name)
    with pytest.raises(ValueError, match=r"old/.*\.parquet: not a served log file; its columns are \[.*\], expected "
                                         r"\[.*'k'.*\]"):
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "served_log": str(tmp_path / "old")})
    assert not (tmp_path / "m.csv").exists()


def test_a_reference_of_another_catalogue_is_refused_before_it_crosses_psi_max(inputs: dict, tmp_path: Path) -> None:
    """The reference named another model's directory (items 1000..1003): every request was unknown, the PSI NaN and
    coverage 0, and with psi_max set the run exited 3, "psi undefined", which the documented chain answers with a
    retrain, every day. No item the server recommended is among the reference's products: refused in one line."""
    (tmp_path / "other").mkdir()
    ItemVocab.fit(pa.array([1000, 1001, 1002, 1003])).save(tmp_path / "other" / "vocab.parquet")
    with pytest.raises(ValueError) as err:
        monitor(out=str(tmp_path / "m.csv"), **{**inputs, "reference": str(tmp_path / "other"),
                                                "thresholds": Thresholds(psi_max=0.25)})
    assert str(err.value) == (f"{tmp_path / 'other'}: none of the 14 items recommended in the served log "
                              f"{inputs['served_log']} is among its vocabulary's 4 products (e.g. 1000; the log's first "
                              "11): a reference of another catalogue than the model served; name the served model "
                              "directory")
    assert not (tmp_path / "m.csv").exists()


def test_an_output_that_is_an_event_file_or_another_output_is_refused_before_anything_is_read(
        inputs: dict, tmp_path: Path) -> None:
    events = inputs["paths"][0]
    before = Path(events).read_bytes()
    with pytest.raises(ValueError, match=rf"^monitor: out {re.escape(events)} is the event file {re.escape(events)} that "
                                         "the run reads; name another file$"):
        monitor(out=events, **inputs)
    through = f"{tmp_path}/new/../events.csv"  # a missing folder and back: the same file
    with pytest.raises(ValueError, match=r"^monitor: canary_out .*/new/\.\./events.csv is the event file"):
        monitor(out=str(tmp_path / "m.csv"), canary_out=through, **inputs)
    with pytest.raises(ValueError, match=rf"^monitor: canary_out {tmp_path}/m.csv is the file out names; name another file$"):
        monitor(out=str(tmp_path / "m.csv"), canary_out=str(tmp_path / "m.csv"), **inputs)
    (tmp_path / "d.csv").mkdir()
    for name in ("out", "canary_out"):  # a canary_out is written only when a canary ran: refused before either way
        with pytest.raises(ValueError, match=rf"^monitor: {name} {tmp_path}/d.csv is a directory; name a file in it$"):
            monitor(**{"out": str(tmp_path / "m.csv"), **inputs, name: str(tmp_path / "d.csv")})
    assert Path(events).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "events.csv", "log", "ref"]


def test_an_existing_output_is_refused_before_anything_is_read_unless_overwrite(inputs: dict, tmp_path: Path,
                                                                               capsys, monkeypatch) -> None:
    outputs = {"out": tmp_path / "m.csv", "canary_out": tmp_path / "c.csv", "plot": tmp_path / "m.png"}
    for name, path in outputs.items():  # a canary_out is written only when a canary ran: refused before either way
        path.write_text("kept")
        given = {"out": str(tmp_path / "new.csv"), **inputs, name: str(path)}
        with pytest.raises(FileExistsError, match=rf"^monitor: {name} {re.escape(str(path))} exists; set overwrite true "
                                                  "to replace it, or name another file$"):
            monitor(**{**given, "served_log": str(tmp_path / "none")})  # refused before the log is read
        assert path.read_text() == "kept" and not (tmp_path / "new.csv").exists()
        path.unlink()
    (tmp_path / "m.csv").write_text("kept")
    monkeypatch.setattr(sys, "argv", ["sessrec", *cli_args(inputs, tmp_path, {})])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == (f"sessrec monitor: error: monitor: out {tmp_path / 'm.csv'} exists; set overwrite true "
                                "to replace it, or name another file (--traceback for details)")
    assert (tmp_path / "m.csv").read_text() == "kept"
    assert run(cli_args(inputs, tmp_path, {}, overwrite=True)).num_rows == 2
    assert pacsv.read_csv(tmp_path / "m.csv").column("evaluated").to_pylist() == [4, 1]


def replay(recommender, sessions: pa.Table, directory: Path, version: str, per_request: int = 64) -> list[dict]:
    """Each session's events but its last, as the requests a server gets, through the server's app (`build_app`
    with a `ServedLog` in `directory`, as ``sessrec serve --served_log`` builds it); its answers."""
    from fastapi.testclient import TestClient

    from sessrec.serving.app import build_app
    from sessrec.serving.recommender import Served

    ids = [str(s) for s in sessions.column("session_id").to_pylist()]
    items, times = sessions.column("item_id").to_pylist(), sessions.column("timestamp").to_pylist()
    answers = []
    app = build_app(Served(recommender, version=version), served_log=ServedLog(directory))
    with TestClient(app) as client:  # the log is closed (flushed) when the app shuts down
        for start in range(0, len(ids), per_request):
            part = slice(start, start + per_request)
            body = {"sessions": [s[:-1] for s in items[part]], "times": [t[:-1] for t in times[part]], "k": 20,
                    "session_ids": ids[part]}
            answer = client.post("/recommend", json=body, headers={"X-Request-Id": f"r{start}"})
            assert answer.status_code == 200, answer.text
            answers += answer.json()["recommendations"]
        metrics = client.get("/metrics").text
    assert 'sessrec_served_log_rows{outcome="dropped"} 0.0' in metrics  # "written" counts rows in closed files
    return answers


@pytest.mark.slow
def test_a_replayed_day_monitors_to_the_hit_rate_of_sessrec_test_and_a_drifted_day_exits_3(tmp_path, capsys, monkeypatch):
    """A tiny XLNet fitted on synthetic days; its test day replayed through the server (its app, as ``sessrec serve
    --served_log`` runs it) into a served log: ``sessrec monitor`` gives the recall@20 of ``sessrec test`` on the same sessions, with little drift; the
    same day with its items shifted along the popularity ranking crosses psi_max and exits 3."""
    from sessrec.cli import cli
    from sessrec.data import TimeWindowSource, generate_sessions
    from sessrec.serving.recommender import load_recommender

    events = generate_sessions(num_sessions=3000, num_items=80, seed=1)
    events = events.filter(pc.equal(events.column("event_type"), "product")).select(["session_id", "item_id", "timestamp"])
    pq.write_table(events, tmp_path / "events.parquet")
    t = np.sort(events.column("timestamp").to_numpy())
    train_from, train_until, test_until = (float(np.quantile(t, q)) for q in (0.0, 0.6, 0.8))
    source = {"class_path": "sessrec.data.TimeWindowSource",
              "init_args": {"paths": [str(tmp_path / "events.parquet")], "train_from": train_from,
                            "train_until": train_until, "test_until": test_until}}
    recipe = tmp_path / "fit.yaml"
    recipe.write_text(yaml.safe_dump({
        "seed_everything": 0,
        "trainer": {"max_epochs": 2, "accelerator": "cpu", "logger": False, "default_root_dir": str(tmp_path),
                    "enable_progress_bar": False, "enable_model_summary": False,
                    "callbacks": [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                                   "init_args": {"monitor": "val/recall@20", "mode": "max", "save_top_k": 1,
                                                 "filename": "best", "dirpath": str(tmp_path / "checkpoints")}}]},
        "model": {"encoder": {"class_path": "sessrec.models.XLNetEncoder",
                              "init_args": {"d_model": 16, "n_head": 2, "n_layer": 1, "dropout": 0.1}},
                  "optimization": {"lr": 0.003}, "schedule": {"warmup_steps": 5}},
        "data": {"source": source, "max_length": 10, "batch_size": 128},
    }))
    cli(["fit", "--config", str(recipe)])
    model = tmp_path / "model"
    tested = cli(["test", "--config", str(recipe), "--model_dir", str(model)]).trainer.callback_metrics

    test = TimeWindowSource(**source["init_args"]).load().test
    recommender = load_recommender(model)
    answers = replay(recommender, test, tmp_path / "served", "v000001")
    logged = pq.read_table(tmp_path / "served")
    logged = logged.append_column("request", pc.cast(pc.utf8_slice_codeunits(logged.column("request_id"), 1), pa.int64()))
    logged = logged.sort_by([("request", "ascending"), ("session_index", "ascending")])
    assert logged.column("recommended").to_pylist() == [[str(i) for i in a["item_ids"]] for a in answers]
    assert logged.column("session_id").to_pylist() == [str(s) for s in test.column("session_id").to_pylist()]
    assert set(logged.column("model_version").to_pylist()) == {"v000001"}
    base = {"paths": [str(tmp_path / "events.parquet")], "reference": str(model), "k": 20, "window_hours": 1e6,
            "thresholds": {"psi_max": 0.25}}
    config = tmp_path / "monitor.yaml"
    config.write_text(yaml.safe_dump({**base, "served_log": str(tmp_path / "served"), "out": str(tmp_path / "day.csv")}))
    day = run(["monitor", "--config", str(config)]).to_pylist()
    assert len(day) == 1 and day[0]["requests"] == test.num_rows == day[0]["evaluated"]
    assert day[0]["hit_rate@20"] == pytest.approx(float(tested["test/recall@20"]), abs=1e-6)  # 0.6758 (396 / 586)
    assert day[0]["mrr@20"] == pytest.approx(float(tested["test/mrr@20"]), abs=1e-6)
    assert day[0]["psi"] < 0.25 and day[0]["unknown_share"] < 0.05

    # the same sessions, each item replaced by the one 40 places further along the training ranking
    ranked = pc.cast(recommender.vocab.raw_ids, pa.int64()).to_numpy()
    shift = dict(zip(ranked, np.roll(ranked, -len(ranked) // 2), strict=True))
    shifted_items = pa.array([[int(shift.get(i, i)) for i in s] for s in test.column("item_id").to_pylist()])
    drifted = test.set_column(test.schema.get_field_index("item_id"), "item_id", shifted_items)
    flat = pa.table({"session_id": pc.list_parent_indices(drifted.column("item_id")),
                     "item_id": pc.list_flatten(drifted.column("item_id")),
                     "timestamp": pc.list_flatten(drifted.column("timestamp"))})
    flat = flat.set_column(0, "session_id", drifted.column("session_id").take(flat.column("session_id")))
    pq.write_table(flat, tmp_path / "drifted.parquet")
    replay(recommender, drifted, tmp_path / "served_drifted", "v000001")
    config.write_text(yaml.safe_dump({**base, "paths": [str(tmp_path / "drifted.parquet")], "overwrite": True,
                                      "served_log": str(tmp_path / "served_drifted"), "out": str(tmp_path / "drift.csv")}))
    monkeypatch.setattr(sys, "argv", ["sessrec", "monitor", "--config", str(config)])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 3
    assert capsys.readouterr().err.startswith("sessrec monitor: threshold crossed: psi ")
    assert pacsv.read_csv(tmp_path / "drift.csv").column("psi")[0].as_py() > 0.25  # 2.74 (0.022 before the shift)

    # the chain of docs/deploy.md: a retrain follows status 3 (the next window: from where the model's data ends)
    (tmp_path / "retrain.yaml").write_text(yaml.safe_dump({
        "model_dir": str(model), "paths": [str(tmp_path / "events.parquet")], "max_epochs": 1, "batch_size": 128,
        "gate": {"metric": "recall@20", "tolerance": 0.99, "min_pairs": 10}}))
    sessrec = f'"{sys.executable}" -m sessrec.cli'
    chain = (f"{sessrec} monitor --config {config}; [ $? -eq 3 ] && {sessrec} retrain --config {tmp_path / 'retrain.yaml'}"
             f" --train_from {train_until} --train_until {test_until} --test_until {float(t[-1]) + 1} --out {tmp_path / 'next'}")
    done = subprocess.run(["bash", "-c", chain], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sessrec monitor: threshold crossed: psi " in done.stderr
    assert re.search(r"^sessrec retrain: promoted as v000002", done.stdout, re.MULTILINE), done.stdout[-2000:]
    assert (tmp_path / "next" / "model").is_dir() and (model / "CURRENT").read_text().strip() == "v000002"


def canary_day(tmp_path: Path, live: int, canary: int, recommended) -> ServedLog:
    """Sessions l0.. (live, v000001) and c0.. (canary, v000002) of events 10, 11 at T0 in `tmp_path`/events.csv, and an
    open served log in `tmp_path`/log with one request each (its last event 10): `recommended(i, on_canary)` lists."""
    sessions = [f"l{i}" for i in range(live)] + [f"c{i}" for i in range(canary)]
    events = pa.table({"sid": [s for s in sessions for _ in (0, 1)], "item": [10, 11] * len(sessions),
                       "t": [T0 + 10 * i + j for i in range(len(sessions)) for j in (0, 1)]})
    pacsv.write_csv(events, tmp_path / "events.csv")
    log = ServedLog(tmp_path / "log")
    for i, session in enumerate(sessions):
        on_canary = session.startswith("c")
        log.record(f"r{i}", [[10]], [{"item_ids": recommended(i, on_canary), "scores": [2.0, 1.0]}],
                   "v000002" if on_canary else "v000001", now=[T0 + 10 * i], session_ids=[session], canary=on_canary)
    return log


def test_the_canary_is_compared_with_the_live_version_on_the_same_window(tmp_path: Path, capsys) -> None:
    """Live sessions l0..l7 and canary sessions c0..c3 (events 10, 11): the live version ranks the next
    item first for six of eight, the canary second for two of four; a request of day 1 has no canary beside it."""
    def recommended(i: int, on_canary: bool) -> list[int]:
        hit = (i < 6) if not on_canary else (i < 10)
        return ([13, 11] if hit else [12, 13]) if on_canary else ([11, 12] if hit else [12, 13])

    with canary_day(tmp_path, 8, 4, recommended) as log:
        log.record("late", [[10]], [{"item_ids": [11, 12], "scores": [2.0, 1.0]}], "v000002", now=[T0 + DAY],
                   session_ids=["l0"])
    (tmp_path / "ref").mkdir()
    table = monitor(str(tmp_path / "log"), [str(tmp_path / "events.csv")], str(reference(tmp_path / "ref")),
                    str(tmp_path / "m.csv"), schema=SCHEMA, k=2, psi_bins=2, canary_out=str(tmp_path / "c.csv"))
    assert [(r["model_version"], r["evaluated"], r["hit_rate@2"]) for r in table.to_pylist()] == [
        ("v000001", 8, 0.75), ("v000002", 4, 0.5), ("v000002", 1, 1.0)]
    (row,) = pacsv.read_csv(tmp_path / "c.csv").to_pylist()
    assert (row["live_version"], row["canary_version"], row["live_evaluated"], row["canary_evaluated"]) == (
        "v000001", "v000002", 8, 4)
    assert (row["live_hit_rate@2"], row["canary_hit_rate@2"], row["hit_rate@2_difference"]) == (0.75, 0.5, -0.25)
    assert (row["live_mrr@2"], row["canary_mrr@2"], row["mrr@2_difference"]) == (0.75, 0.25, -0.5)
    for name in ("hit_rate@2", "mrr@2"):
        assert -1 <= row[f"{name}_low"] < row[f"{name}_difference"] < row[f"{name}_high"] <= 1
    assert "canary against live (difference: canary - live, with its 95% interval)" in capsys.readouterr().out
    # the interval of MRR@2's difference is [-0.875, -0.125]: worse by more than 0.1, not surely by more than 0.2;
    # hit rate@2's, [-0.75, 0.375], crosses 0: not surely worse at all
    assert Thresholds(canary_mrr_loss_max=0.2, canary_hit_rate_loss_max=0.0).canary_crossed(
        pacsv.read_csv(tmp_path / "c.csv"), 2) == []
    with pytest.raises(CanaryWorse, match=r"^canary v000002 mrr@2 0.2500 against live v000001 0.7500: the difference's "
                       r"interval \[-0.8750, -0.1250\] lies below -canary_mrr_loss_max 0.1 \(window from 2023-11-15T00:00Z\) "
                       r"\(and 2 more, see .*m\.csv and the comparison above\)$"):  # hit_rate_min: both rows
        monitor(str(tmp_path / "log"), [str(tmp_path / "events.csv")], str(tmp_path / "ref"), str(tmp_path / "m.csv"),
                schema=SCHEMA, k=2, psi_bins=2, thresholds=Thresholds(canary_mrr_loss_max=0.1, hit_rate_min=0.9),
                overwrite=True)
    with pytest.raises(ValueError, match=r"thresholds canary_mrr_loss_max must be a finite number >= 0, got -0.1"):
        Thresholds(canary_mrr_loss_max=-0.1)
    for name, limit in (("canary_mrr_loss_max", 5.0), ("canary_hit_rate_loss_max", 1.0)):  # 5 meant as 5 points
        with pytest.raises(ValueError) as err:  # no difference of two shares is below -1: never crossed, silently
            Thresholds(**{name: limit})
        assert str(err.value) == (f"thresholds {name} must be below 1, got {limit}: the difference of two shares in "
                                  "[0, 1] is never below -1, so this limit could never be crossed; a loss is a share "
                                  "(0.05 for 5 points)")


def test_a_day_without_a_canary_replaces_the_comparison_of_the_day_before(tmp_path: Path) -> None:
    """A daily run into one --canary_out with overwrite: a day after the canary ended left the day before's
    comparison in place, read as today's. The day without a canary writes the table's columns and no row."""
    canary_day(tmp_path, 4, 4, lambda i, on_canary: [11, 12]).close()
    (tmp_path / "ref").mkdir()
    given = dict(schema=SCHEMA, k=2, psi_bins=2, canary_out=str(tmp_path / "c.parquet"), overwrite=True)
    monitor(str(tmp_path / "log"), [str(tmp_path / "events.csv")], str(reference(tmp_path / "ref")),
            str(tmp_path / "m.csv"), **given)
    before = pq.read_table(tmp_path / "c.parquet")
    assert before.num_rows == 1
    with ServedLog(tmp_path / "next") as log:  # the next day: the canary ended, every session on v000002
        log.record("r0", [[10]], [{"item_ids": [11, 12], "scores": [2.0, 1.0]}], "v000002", now=[T0 + 20],
                   session_ids=["l0"])
    monitor(str(tmp_path / "next"), [str(tmp_path / "events.csv")], str(tmp_path / "ref"), str(tmp_path / "m.csv"),
            **given)
    after = pq.read_table(tmp_path / "c.parquet")
    assert after.num_rows == 0 and after.schema.equals(before.schema)


def test_a_worse_canary_exits_4_before_any_other_threshold(tmp_path: Path, capsys, monkeypatch) -> None:
    """Live sessions hit first, the canary's never: exit 4 and one line naming the canary; the live version's
    own threshold, crossed too, is counted in the line, for the run after the rollback."""
    canary_day(tmp_path, 20, 20, lambda i, on_canary: [12, 13] if on_canary else [11, 12]).close()
    (tmp_path / "ref").mkdir()
    recipe = {"served_log": str(tmp_path / "log"), "paths": [str(tmp_path / "events.csv")],
              "reference": str(reference(tmp_path / "ref")), "out": str(tmp_path / "m.csv"), "k": 2, "psi_bins": 2,
              "schema": {"session_id": "sid", "item_id": "item", "timestamp": "t"},
              "thresholds": {"canary_hit_rate_loss_max": 0.5, "hit_rate_min": 0.5}}
    (tmp_path / "monitor.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.setattr(sys, "argv", ["sessrec", "monitor", "--config", str(tmp_path / "monitor.yaml")])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 4
    err = capsys.readouterr().err.strip()
    assert err == ("sessrec monitor: canary worse: canary v000002 hit_rate@2 0.0000 against live v000001 1.0000: the "
                   "difference's interval [-1.0000, -1.0000] lies below -canary_hit_rate_loss_max 0.5 (window from "
                   f"2023-11-15T00:00Z) (and 1 more, see {tmp_path / 'm.csv'} and the comparison above)")
    assert (tmp_path / "m.csv").exists()


def test_the_comparisons_interval_is_the_two_sample_interval_of_a_difference_of_means() -> None:
    """Hit rates of 0.5 (400 sessions) and 0.4 (400): the bootstrap interval's half-width is the normal
    interval's 1.96 * sqrt(0.25 / 400 + 0.24 / 400) = 0.0686, within 10%."""
    from sessrec.lifecycle.monitor import difference_interval

    a, b = np.repeat([1.0, 0.0], [200, 200]), np.repeat([1.0, 0.0], [160, 240])
    low, high = difference_interval(a, b, 0.95, 4000, np.random.default_rng(0))
    assert (high - low) / 2 == pytest.approx(1.96 * np.sqrt(0.25 / 400 + 0.24 / 400), rel=0.1)
    assert (low + high) / 2 == pytest.approx(0.1, abs=0.01)
    assert np.isnan(difference_interval(a, b[:0], 0.95, 10, np.random.default_rng(0))).all()


def test_the_comparisons_interval_resamples_sessions_not_the_requests_of_a_session(tmp_path: Path) -> None:
    """Each of 40 live and 40 canary sessions (events 10, 11, 10, 11) is served three times, at each of its
    first three events, and every request of a session hits or every one misses: 20 live sessions and 16 canary
    ones hit. The sessions, not the 120 requests a side, are the sample: the interval's half-width is the
    normal one over 40 sessions a side, 1.96 * sqrt(0.25 / 40 + 0.24 / 40) = 0.2169, within 15%."""
    sessions = [(f"l{i}", False, i < 20) for i in range(40)] + [(f"c{i}", True, i < 16) for i in range(40)]
    items = [10, 11, 10, 11]
    events = pa.table({"sid": [s for s, _, _ in sessions for _ in items], "item": items * len(sessions),
                       "t": [T0 + 10 * i + j for i in range(len(sessions)) for j in range(len(items))]})
    pacsv.write_csv(events, tmp_path / "events.csv")
    with ServedLog(tmp_path / "log") as log:
        for i, (session, on_canary, hit) in enumerate(sessions):
            for n in (1, 2, 3):
                recommended = [items[n], 12] if hit else [12, 13]
                log.record(f"r{i}-{n}", [items[:n]], [{"item_ids": recommended, "scores": [2.0, 1.0]}],
                           "v000002" if on_canary else "v000001", now=[T0 + 10 * i + n - 1], session_ids=[session],
                           canary=on_canary)
    (tmp_path / "ref").mkdir()
    monitor(str(tmp_path / "log"), [str(tmp_path / "events.csv")], str(reference(tmp_path / "ref")),
            str(tmp_path / "m.csv"), schema=SCHEMA, k=2, psi_bins=2, canary_out=str(tmp_path / "c.csv"))
    (row,) = pacsv.read_csv(tmp_path / "c.csv").to_pylist()
    assert (row["live_evaluated"], row["canary_evaluated"], row["hit_rate@2_difference"]) == (120, 120, pytest.approx(-0.1))
    half_width = (row["hit_rate@2_high"] - row["hit_rate@2_low"]) / 2
    assert half_width == pytest.approx(1.96 * np.sqrt(0.25 / 40 + 0.24 / 40), rel=0.15)
