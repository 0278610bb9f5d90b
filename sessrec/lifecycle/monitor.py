"""``sessrec monitor``: how the served recommendations did, per model version and time window, and drift.

`monitor` joins a served log (`sessrec.serving.served_log`, one row per served session) with the event
log of the same sessions (any file `sessrec.data.scan_events` reads, with its `Schema`: the ``paths`` and
``schema`` of a data recipe's source) and reports, per model version and window of the requests' time
(``now``: the request's time, else its last event's, else its arrival):

- ``hit_rate@k`` and ``mrr@k`` of the next event: the event of the same session (``session_id``) right
  after the request's events. A request carries its session from the first event, so the next event is
  the session's event at position ``n_events`` in time order (`sessrec.data.frame.sort_events`); a row
  whose items (its last ``max_events``) are not the event log's at their positions, up to ``n_events - 1``
  (a row without a session id, a session the event log does not hold, or a request that did not start at
  the session's first event) is counted in ``unmatched`` and left out, as are rows whose session ended with the request
  (``ended``). An unknown target counts as a miss, as ``sessrec test`` counts it. ``evaluated`` rows
  give the two rates; a window without one (the log's last, whose sessions have no next event yet) has
  NaN rates, is printed as not judged and crosses no hit rate or MRR threshold.
- ``coverage@k``: the share of the reference vocabulary's products that are among the first `k` recommended
  of some request, in [0, 1]; a recommended item the reference lacks (a later version's vocabulary grew) is
  not counted.
- ``unknown_share``: share of requests whose newest event is an item the reference vocabulary lacks.
- ``psi``: population stability index of the requests' newest known items against the training data:
  the reference's products ranked by training count and cut into `psi_bins` bins of about equal
  training mass; shares floored at `PSI_FLOOR`; ``sum((q - p) * ln(q / p))``. 0.1 is a common "watch"
  level and 0.25 a common "act" level. Unknown items are ``unknown_share``'s, not in the index: a
  catalogue that gains items every day (4% of rsc15's requests name an item its last three days did
  not) would otherwise read as drift through the floor of an empty training bin. NaN when no
  requested item is known, which crosses any ``psi_max``.

When the served log holds rows a canary answered (``sessrec serve --canary``: its ``canary`` column),
`compare_canary` sets the canary against the live version on each window: each side's hit rate@k and
MRR@k, their difference and its bootstrap interval over the sessions of each side. A canary worse than
live by more than a tolerance (`Thresholds.canary_hit_rate_loss_max`, ``canary_mrr_loss_max``: the
whole interval below minus it) raises `CanaryWorse`, exit status 4: a scheduler chains
``sessrec rollback`` on it.

The reference is a model directory (at its current version when it is versioned) or a prepared
dataset: either holds ``vocab.parquet``, the training counts of its items (`ItemVocab`).

The table is written to `out` (``.csv`` or ``.parquet``) and printed; `plot` draws the metrics over the
windows with matplotlib (the ``dev`` extra). Thresholds (`Thresholds`) crossed by any row raise
`ThresholdCrossed`, which ``sessrec monitor`` turns into exit status 3 and one line, after the table
is written: ``sessrec monitor --config m.yaml; [ $? -eq 3 ] && sessrec retrain --config r.yaml`` retrains
on a crossed threshold only (docs/deploy.md, "Monitoring").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.schema import Schema
from sessrec.data.vocab import ItemVocab
from sessrec.lifecycle.gate import DRAWS_PER_CHUNK
from sessrec.lifecycle.monitor_inputs import (
    check_reference,
    event_positions,
    product_ids,
    read_served,
    reference_vocab,
)
from sessrec.lifecycle.monitor_output import check_outputs, format_table, plot_table, write_table
from sessrec.saved.registry import check_numbers

__all__ = ["PSI_FLOOR", "CanaryWorse", "ThresholdCrossed", "Thresholds", "compare_canary", "monitor", "psi"]

PSI_FLOOR = 1e-4  # a bin's share below this counts as this (an empty bin would make the index infinite)


class ThresholdCrossed(RuntimeError):
    """A monitored metric crossed its threshold; the message says which, where and by how much."""


class CanaryWorse(ThresholdCrossed):
    """The canary is worse than the live version by more than its tolerance (``sessrec monitor`` exit status 4)."""



def window_label(start: datetime) -> str:
    """A window's start in the messages: ``2024-01-15T10:00Z``, with its seconds (and microseconds) where a window
    shorter than a minute starts within one (two windows never share a label)."""
    if start.microsecond:
        return f"{start:%Y-%m-%dT%H:%M:%S.%f}Z"
    return f"{start:%Y-%m-%dT%H:%M:%S}Z" if start.second else f"{start:%Y-%m-%dT%H:%M}Z"


@dataclass(frozen=True)
class Thresholds:
    """Limits that make ``sessrec monitor`` exit with status 3 (the canary's: 4); None: not checked.

    Args:
        hit_rate_min: lowest acceptable hit rate@k of a (version, window).
        mrr_min: lowest acceptable MRR@k.
        coverage_min: lowest acceptable catalogue coverage@k.
        unknown_max: highest acceptable share of requests whose newest item is unknown.
        psi_max: highest acceptable population stability index of the requested items.
        canary_hit_rate_loss_max: largest acceptable loss of hit rate@k of a canary against live, in [0, 1): crossed
            (`CanaryWorse`) when the whole interval of the difference (canary - live) of a window lies below
            minus it, the canary worse by more than this at the comparison's confidence.
        canary_mrr_loss_max: the same for MRR@k.
    """

    hit_rate_min: float | None = None
    mrr_min: float | None = None
    coverage_min: float | None = None
    unknown_max: float | None = None
    psi_max: float | None = None
    canary_hit_rate_loss_max: float | None = None
    canary_mrr_loss_max: float | None = None

    def __post_init__(self) -> None:
        # each limit where a (version, window) can meet it: a share of requests in (0, 1] at least, below 1 at most
        # (every window meets 1), a PSI above 0 (every drift crosses 0)
        rules = {"hit_rate_min": "share", "mrr_min": "share", "coverage_min": "share", "unknown_max": "rate",
                 "psi_max": "positive", "canary_hit_rate_loss_max": "non-negative", "canary_mrr_loss_max": "non-negative"}
        check_numbers("thresholds", {name: (getattr(self, name), rule) for name, rule in rules.items()
                                     if getattr(self, name) is not None})
        for name in ("canary_hit_rate_loss_max", "canary_mrr_loss_max"):
            limit = getattr(self, name)
            if limit is not None and limit >= 1:  # canary - live of two shares is -1 at least: never below -limit
                raise ValueError(f"thresholds {name} must be below 1, got {limit!r}: the difference of two shares in "
                                 "[0, 1] is never below -1, so this limit could never be crossed; a loss is a share "
                                 "(0.05 for 5 points)")

    def canary_crossed(self, comparison: pa.Table | None, k: int) -> list[str]:
        """One reason per (window, canary limit) crossed in `compare_canary`'s table (None: no canary), in table
        order; a window where a side has no evaluated row (an interval of NaN) tells nothing and crosses none."""
        reasons: list[str] = []
        for row in comparison.to_pylist() if comparison is not None else []:
            for name, metric in (("canary_hit_rate_loss_max", f"hit_rate@{k}"), ("canary_mrr_loss_max", f"mrr@{k}")):
                limit, low, high = getattr(self, name), row[f"{metric}_low"], row[f"{metric}_high"]
                if limit is None or math.isnan(high) or not high < -limit:
                    continue
                reasons.append(f"canary {row['canary_version']} {metric} {row[f'canary_{metric}']:.4f} against live "
                               f"{row['live_version']} {row[f'live_{metric}']:.4f}: the difference's interval "
                               f"[{low:.4f}, {high:.4f}] lies below -{name} {limit:g} "
                               f"(window from {window_label(row['window_start'])})")
        return reasons

    def crossed(self, table: pa.Table, k: int) -> list[str]:
        """One reason per (row, limit) crossed, in table order; a row without a judged request (``evaluated`` 0:
        hit rate and MRR NaN) crosses no hit rate or MRR limit, unless no row has one."""
        checks = [("hit_rate_min", f"hit_rate@{k}", min), ("mrr_min", f"mrr@{k}", min),
                  ("coverage_min", f"coverage@{k}", min), ("unknown_max", "unknown_share", max), ("psi_max", "psi", max)]
        judged = [name for name in ("hit_rate_min", "mrr_min") if getattr(self, name) is not None]
        if judged and not any(table.column("evaluated").to_pylist()):
            raise ValueError(f"no served request has a next event in the event log, so {' and '.join(judged)} cannot "
                             "be checked; check the event log and the period")
        reasons = []
        for row in table.to_pylist():
            for name, column, side in checks:
                limit = getattr(self, name)
                if limit is None:
                    continue
                value = row[column]
                where = f"version {row['model_version']}, window from {window_label(row['window_start'])}"
                if column == "psi" and math.isnan(value):
                    reasons.append(f"psi undefined: no requested item is in the training vocabulary ({where})")
                    continue
                if math.isnan(value):  # hit rate or MRR of a window without a judged request
                    continue
                if (value < limit) if side is min else (value > limit):
                    reasons.append(f"{column} {value:.4f} {'<' if side is min else '>'} {name} {limit:g} ({where})")
        return reasons


def monitor(
    served_log: str,
    paths: list[str],
    reference: str,
    out: str,
    schema: Schema = Schema(),  # noqa: B008 - a config value, never mutated
    k: int = 20,
    window_hours: float = 24.0,
    since: str | None = None,
    until: str | None = None,
    versions: list[str] | None = None,
    thresholds: Thresholds = Thresholds(),
    psi_bins: int = 10,
    delimiter: str | None = None,
    plot: str | None = None,
    canary_out: str | None = None,
    confidence: float = 0.95,
    overwrite: bool = False,
) -> pa.Table:
    """Hit rate, MRR, coverage, unknown share and drift of the served recommendations, per version and window.

    Args:
        served_log: the folder of a served log (``served-*.parquet``, `sessrec.serving.served_log`).
        paths: event files of the served sessions (CSV/TSV/parquet), read with `schema`; no two may hold one event.
        reference: a model directory or a prepared dataset: its ``vocab.parquet`` is the training distribution.
        out: the table (``.csv`` or ``.parquet``).
        schema: column roles of the event files.
        k: the rank cut of hit rate, MRR and coverage; every evaluated request must have asked for `k` items or more
            (an answer shorter than the k asked for holds every item its version had); a row that does not record
            its k must have been answered with `k` items at least.
        window_hours: length of the time windows (aligned on the epoch: 24 gives UTC days).
        since: first request time kept (ISO-8601 or epoch seconds); None: all.
        until: requests before this time kept; None: all.
        versions: the model versions reported (each must have rows in the period); None: every version served.
        thresholds: limits that raise `ThresholdCrossed` once the table is written.
        psi_bins: bins of equal training mass of the population stability index.
        delimiter: text-file separator of the event files; sniffed when None.
        plot: a ``.png`` of the metrics over the windows (matplotlib); None: none.
        canary_out: where the canary's comparison with the live version (`compare_canary`) is written
            (``.csv`` or ``.parquet``), printed too; a table of no row when the served log holds no row a canary
            answered.
        confidence: of the comparison's intervals (two-sided).
        overwrite: replace the files of `out`, `canary_out` and `plot` where they exist (otherwise refused, before
            anything is read).

    Returns:
        The table: ``model_version``, ``window_start``, ``requests``, ``evaluated``, ``unmatched``,
        ``ended``, ``hit_rate@k``, ``mrr@k``, ``coverage@k``, ``unknown_share``, ``psi``.

    Raises:
        CanaryWorse: a canary is worse than live by more than a canary threshold (tables written first).
        ThresholdCrossed: some row crosses another threshold (the table is written first).
        FileExistsError: `out`, `canary_out` or `plot` exists and `overwrite` is false.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"monitor: k must be an integer of 1 or more, got {k!r}")
    if not window_hours > 0 or psi_bins < 1:
        raise ValueError(f"monitor: window_hours must be > 0 and psi_bins >= 1, got {window_hours} and {psi_bins}")
    if Path(out).suffix not in (".csv", ".parquet"):
        raise ValueError(f"monitor: out must end in .csv or .parquet, got {out}")
    if plot is not None and Path(plot).suffix != ".png":
        raise ValueError(f"monitor: plot must end in .png, got {plot}")
    if canary_out is not None and Path(canary_out).suffix not in (".csv", ".parquet"):
        raise ValueError(f"monitor: canary_out must end in .csv or .parquet, got {canary_out}")
    if not 0.5 < confidence < 1:
        raise ValueError(f"monitor: confidence must be in (0.5, 1), got {confidence}")
    if versions is not None and not versions:  # an empty list would report no row and check no threshold
        raise ValueError("monitor: versions is an empty list; name at least one version, or leave it out for every "
                         "version served")
    check_outputs({"out": out, "canary_out": canary_out, "plot": plot}, paths, overwrite)
    if plot is not None:  # before anything is read or written: a missing matplotlib would otherwise end the run after
        import matplotlib  # noqa: F401 - the table, with status 1 in place of a crossed threshold's 3 or 4
    served = read_served(served_log, since, until, versions)
    vocab = reference_vocab(reference)
    check_reference(served, vocab, reference, served_log)
    events = event_positions(paths, schema, delimiter)
    outcomes = next_event_ranks(served, events, k, served_log)
    table = report(served, outcomes, vocab, k, 3600.0 * window_hours, psi_bins)
    write_table(table, out)
    print(format_table(table))
    for row in table.filter(pc.equal(table.column("evaluated"), 0)).to_pylist():
        print(f"version {row['model_version']}, window from {window_label(row['window_start'])}: no request with a "
              f"next event; hit_rate@{k} and mrr@{k} not judged")
    comparison = compare_canary(served, outcomes, k, 3600.0 * window_hours, confidence)
    if canary_out is not None:  # no canary: a table of no row, which replaces an earlier run's as out's table does
        write_table(comparison if comparison is not None else no_comparison(k), canary_out)
    if comparison is not None:
        print("\ncanary against live (difference: canary - live, with its "
              f"{confidence:.0%} interval):\n{format_table(comparison)}")
    if plot is not None:
        plot_table(table, k, plot)
    worse, reasons = thresholds.canary_crossed(comparison, k), thresholds.crossed(table, k)
    for kind, found in ((CanaryWorse, worse), (ThresholdCrossed, reasons)):  # a worse canary first: roll it back
        if found:
            rest = len(worse) + len(reasons) - 1
            raise kind(f"{found[0]}" + (f" (and {rest} more, see {out} and the comparison above)" if rest else ""))
    return table


def next_event_ranks(served: pa.Table, events: pa.Table, k: int, source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per served row: (n,) whether its items are the event log's at their positions (``matched``), whether
    its session has a next event (``has_next``), and the reciprocal rank of that next event within the first
    `k` recommended (0: a miss or no next event). See the module docstring."""
    n = served.num_rows
    keys = pa.table({"row": pa.array(np.arange(n)), "session_id": served.column("session_id"), "next": served.column("n_events")})
    after = keys.join(events, ["session_id", "next"], ["session_id", "position"], join_type="inner") \
        .select(["row", "item_id"]).rename_columns(["row", "target"])
    target = _scatter(n, after.column("row"), after.column("target"))
    # every item the row holds (its last max_events) is the event log's at its position, not its last item alone
    items = served.column("items").combine_chunks()
    held = np.diff(items.offsets.to_numpy())  # (n,)
    owner = pc.list_parent_indices(items).to_numpy()
    place = np.arange(len(owner)) - (items.offsets.to_numpy()[owner] - items.offsets.to_numpy()[0])
    at = served.column("n_events").to_numpy()[owner] - held[owner] + place
    flat = pa.table({"row": owner, "session_id": served.column("session_id").take(pa.array(owner)),
                     "at": pa.array(at, pa.int32()), "item": items.flatten()})
    seen = flat.join(events, ["session_id", "at"], ["session_id", "position"], join_type="inner")
    same = pc.equal(seen.column("item"), seen.column("item_id")).to_numpy(zero_copy_only=False)
    matched = (held > 0) & (np.bincount(seen.column("row").to_numpy()[same], minlength=n) == held)
    has_next = pc.is_valid(target).to_numpy(zero_copy_only=False)
    evaluated = matched & has_next

    recommended = served.column("recommended").combine_chunks()
    lengths = pc.list_value_length(recommended).to_numpy(zero_copy_only=False)
    asked = pc.fill_null(served.column("k"), -1).to_numpy()  # -1: a row recorded without its request's k (ServedLog.record)
    fewer = np.flatnonzero(evaluated & (asked >= 0) & (asked < k))
    if len(fewer):  # its hits past the k asked for would be counted as misses
        i = int(fewer[0])
        raise ValueError(f"{source}: request {served.column('request_id')[i]} asked for k={asked[i]}, fewer than k={k}; "
                         f"monitor with a k of at most the k served")
    short = np.flatnonzero(evaluated & (asked < 0) & (lengths < k))
    if len(short):  # a list shorter than k is all the version had only when the request asked for k or more
        i = int(short[0])
        raise ValueError(f"{source}: request {served.column('request_id')[i]} was answered with {lengths[i]} items, "
                         f"fewer than k={k}, and its row does not say the k it asked for; monitor with a k of at most "
                         "the k served")
    parent = pc.list_parent_indices(recommended).to_numpy()
    offsets = recommended.offsets.to_numpy()
    place = np.arange(len(parent)) - (offsets[parent] - offsets[0])
    flat = recommended.flatten()
    within = place < k
    hit = within & pc.fill_null(pc.equal(flat, target.take(pa.array(parent))), False).to_numpy(zero_copy_only=False)
    rr = np.zeros(n)
    rr[parent[hit]] = 1.0 / (place[hit] + 1)
    rr[~evaluated] = 0.0
    return matched, has_next, rr


def report(served: pa.Table, outcomes: tuple[np.ndarray, np.ndarray, np.ndarray], vocab: ItemVocab, k: int,
           window_s: float, bins: int) -> pa.Table:
    """The metrics of `served` rows per (version, window) (see the module docstring), from their `next_event_ranks`."""
    n = served.num_rows
    matched, has_next, rr = outcomes
    evaluated = matched & has_next
    recommended = served.column("recommended").combine_chunks()
    parent = pc.list_parent_indices(recommended).to_numpy()
    offsets = recommended.offsets.to_numpy()
    within = (np.arange(len(parent)) - (offsets[parent] - offsets[0])) < k
    flat = recommended.flatten()
    last = _last_items(served.column("items"))

    products = product_ids(vocab)
    bin_of = _psi_bins(vocab, bins)
    index = pc.index_in(last, value_set=products)
    unknown = pc.is_null(index).to_numpy(zero_copy_only=False)
    request_bin = bin_of[pc.fill_null(index, 0).to_numpy()]

    window = np.floor(served.column("now").to_numpy() / window_s) * window_s
    version = served.column("model_version").combine_chunks()
    groups = pa.table({"model_version": version, "window": window}).group_by(["model_version", "window"]) \
        .aggregate([]).sort_by([("model_version", "ascending"), ("window", "ascending")])
    gid = _group_ids(groups, version, window)
    g = groups.num_rows
    count = lambda mask: np.bincount(gid, weights=mask.astype(np.float64), minlength=g)
    requests, evals = count(np.ones(n, bool)), count(evaluated)
    with np.errstate(invalid="ignore", divide="ignore"):
        hit_rate = count(evaluated & (rr > 0)) / evals
        mrr = np.bincount(gid, weights=np.where(evaluated, rr, 0.0), minlength=g) / evals
    counted = within & pc.is_in(flat, value_set=products).to_numpy(zero_copy_only=False)  # the reference's products
    distinct = pa.table({"g": pa.array(gid[parent[counted]]), "item": flat.filter(pa.array(counted))}) \
        .group_by("g").aggregate([("item", "count_distinct")])
    coverage = np.zeros(g)
    coverage[distinct.column("g").to_numpy()] = distinct.column("item_count_distinct").to_numpy() / max(len(products), 1)
    expected = np.bincount(bin_of, weights=vocab.counts[: len(products)].astype(np.float64), minlength=bins)
    observed = np.bincount((gid * bins + request_bin)[~unknown], minlength=g * bins).reshape(g, bins)
    return pa.table({
        "model_version": groups.column("model_version"),
        "window_start": pa.array((groups.column("window").to_numpy() * 1e6).astype(np.int64), pa.timestamp("us", tz="UTC")),
        "requests": requests.astype(np.int64),
        "evaluated": evals.astype(np.int64),
        "unmatched": count(~matched).astype(np.int64),
        "ended": count(matched & ~has_next).astype(np.int64),
        f"hit_rate@{k}": hit_rate,
        f"mrr@{k}": mrr,
        f"coverage@{k}": coverage,
        "unknown_share": count(unknown) / requests,
        "psi": np.array([psi(expected, o) for o in observed]),
    })


def compare_canary(served: pa.Table, outcomes: tuple[np.ndarray, np.ndarray, np.ndarray], k: int, window_s: float,
                   confidence: float = 0.95, samples: int = 2000, seed: int = 0) -> pa.Table | None:
    """The canary against the live version in each window, from the rows' `next_event_ranks`; None when no
    row was answered by a canary.

    One row per window and canary version: the live rows of the window (those the canary did not
    answer, whichever live version answered them) against the canary's, each side's hit rate@k and
    MRR@k over its evaluated rows, the difference (canary - live) and its two-sided `confidence`
    interval: a bootstrap that resamples the live sessions and the canary sessions of the window apart,
    each drawn with all its rows (`samples` times, seeded by `seed`), since the requests of one session
    are not independent of each other. The two sides are disjoint sets of sessions (a session goes to
    one version), so the interval is over sessions, not pairs; the same window keeps both under the
    same traffic.
    """
    canary = served.column("canary").to_numpy(zero_copy_only=False)
    if not canary.any():
        return None
    matched, has_next, rr = outcomes
    evaluated = matched & has_next
    window = np.floor(served.column("now").to_numpy() / window_s) * window_s
    version = served.column("model_version").to_numpy(zero_copy_only=False)
    session = served.column("session_id").to_numpy(zero_copy_only=False)  # every evaluated row has one
    rng = np.random.default_rng(seed)
    pairs = pa.table({"window": window[canary], "version": version[canary]}).group_by(["window", "version"]) \
        .aggregate([]).sort_by([("window", "ascending"), ("version", "ascending")]).to_pylist()
    rows = []
    for pair in pairs:
        in_window = window == pair["window"]
        live = in_window & ~canary & evaluated
        tried = in_window & canary & (version == pair["version"]) & evaluated
        row = {"window_start": pair["window"], "live_version": "+".join(sorted(set(version[live].tolist()))),
               "canary_version": pair["version"], "live_evaluated": int(live.sum()), "canary_evaluated": int(tried.sum())}
        for name, values in ((f"hit_rate@{k}", (rr > 0).astype(np.float64)), (f"mrr@{k}", rr)):
            row[f"live_{name}"], row[f"canary_{name}"] = _mean(values[live]), _mean(values[tried])
            row[f"{name}_difference"] = row[f"canary_{name}"] - row[f"live_{name}"]
            row[f"{name}_low"], row[f"{name}_high"] = difference_interval(values[tried], values[live], confidence,
                                                                          samples, rng, session[tried], session[live])
        rows.append(row)
    table = pa.Table.from_pylist(rows)
    stamps = pa.array((table.column("window_start").to_numpy() * 1e6).astype(np.int64), pa.timestamp("us", tz="UTC"))
    return table.set_column(0, "window_start", stamps)


def no_comparison(k: int) -> pa.Table:
    """`compare_canary`'s table of no row: its columns, for a run whose served log holds no canary's row."""
    columns = {"window_start": pa.timestamp("us", tz="UTC"), "live_version": pa.string(), "canary_version": pa.string(),
               "live_evaluated": pa.int64(), "canary_evaluated": pa.int64()}
    for name in (f"hit_rate@{k}", f"mrr@{k}"):
        columns.update({f"{side}{name}{end}": pa.float64() for side, end in
                        (("live_", ""), ("canary_", ""), ("", "_difference"), ("", "_low"), ("", "_high"))})
    return pa.schema(columns).empty_table()


def difference_interval(a: np.ndarray, b: np.ndarray, confidence: float, samples: int, rng: np.random.Generator,
                        a_sessions: np.ndarray | None = None, b_sessions: np.ndarray | None = None) -> tuple[float, float]:
    """The two-sided `confidence` interval of ``mean(a) - mean(b)`` by a bootstrap resampling `a` and `b`
    apart, by session: each side's values of one session (`a_sessions`, `b_sessions`: a session id per value;
    None: every value its own session) are drawn together. NaN when either is empty.

    Examples:
        >>> low, high = difference_interval(np.ones(50), np.zeros(50), 0.95, 200, np.random.default_rng(0))
        >>> (low, high)
        (1.0, 1.0)
    """
    if len(a) == 0 or len(b) == 0:
        return math.nan, math.nan
    spread = _bootstrap_means(a, a_sessions, samples, rng) - _bootstrap_means(b, b_sessions, samples, rng)
    tail = (1 - confidence) / 2
    low, high = np.quantile(spread, [tail, 1 - tail])
    return float(low), float(high)


def _bootstrap_means(values: np.ndarray, sessions: np.ndarray | None, samples: int, rng: np.random.Generator) -> np.ndarray:
    """(samples,) means of `values` over their sessions resampled with replacement (each drawn with all its values;
    `sessions` None: each value alone), drawn in chunks of at most `DRAWS_PER_CHUNK` indices."""
    if sessions is None:
        sums, counts = values.astype(np.float64), np.ones(len(values))
    else:
        _, group = np.unique(sessions, return_inverse=True)
        sums, counts = np.bincount(group, weights=values), np.bincount(group).astype(np.float64)
    n = len(sums)
    means = np.empty(samples)
    rows = max(1, DRAWS_PER_CHUNK // n)
    for start in range(0, samples, rows):
        stop = min(start + rows, samples)
        drawn = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = np.take(sums, drawn).sum(axis=1) / np.take(counts, drawn).sum(axis=1)
    return means


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else math.nan


def psi(expected: np.ndarray, observed: np.ndarray, floor: float = PSI_FLOOR) -> float:
    """Population stability index of two histograms over the same bins (counts or shares); NaN when
    `observed` is empty.

    Examples:
        >>> psi(np.array([50, 50]), np.array([50, 50]))
        0.0
        >>> round(psi(np.array([50, 50]), np.array([90, 10])), 4)  # 0.4 ln 1.8 + 0.4 ln 5
        0.8789
    """
    if observed.sum() == 0:
        return math.nan
    p = np.maximum(expected / expected.sum(), floor)
    q = np.maximum(observed / observed.sum(), floor)
    return float(np.sum((q - p) * np.log(q / p)))


def _last_items(items: pa.ChunkedArray) -> pa.Array:
    """The last element of each (non-empty) list, as text."""
    items = items.combine_chunks()
    ends = items.offsets.to_numpy()[1:] - items.offsets.to_numpy()[0] - 1
    return items.flatten().take(pa.array(ends))


def _scatter(n: int, rows: pa.ChunkedArray, values: pa.ChunkedArray) -> pa.Array:
    """(n,) array of `values` at `rows`, null elsewhere."""
    where = np.full(n, -1, dtype=np.int64)
    where[rows.to_numpy()] = np.arange(len(rows))
    return values.combine_chunks().take(pa.array(where, mask=where < 0))


def _psi_bins(vocab: ItemVocab, bins: int) -> np.ndarray:
    """(P,) bin of each product: products by decreasing training count cut into `bins` of about equal mass."""
    counts = vocab.counts[: len(vocab.raw_ids) - vocab.num_virtual].astype(np.float64)
    order = np.argsort(-counts, kind="stable")
    before = np.concatenate([[0.0], np.cumsum(counts[order])[:-1]]) / max(counts.sum(), 1.0)
    out = np.empty(len(counts), dtype=np.int64)
    out[order] = np.minimum((before * bins).astype(np.int64), bins - 1)
    return out


def _group_ids(groups: pa.Table, version: pa.Array, window: np.ndarray) -> np.ndarray:
    """(n,) index into `groups` of each row's (version, window)."""
    keyed = groups.append_column("g", pa.array(np.arange(groups.num_rows)))
    rows = pa.table({"row": pa.array(np.arange(len(window))), "model_version": version, "window": window})
    joined = rows.join(keyed, ["model_version", "window"]).select(["row", "g"])
    out = np.empty(len(window), dtype=np.int64)
    out[joined.column("row").to_numpy()] = joined.column("g").to_numpy()
    return out
