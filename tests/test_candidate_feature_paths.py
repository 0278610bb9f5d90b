"""The candidate features' reduced computations equal the plain ones bit for bit, on the edge cases of a batch."""

import pytest
import torch

from sessrec.pipeline.candidate_features import _seen


def plain_seen(items: torch.Tensor, cand: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ``session`` group's repeat columns over the (B, K, L) comparisons of every candidate with every position."""
    eq = items.unsqueeze(1) == cand.unsqueeze(2)
    width = items.shape[1]
    position = torch.arange(1, width + 1)
    count = eq.sum(dim=2)
    distance = width - (eq * position).amax(dim=2)
    return {"seen_count": count.float(),
            "seen_recency": torch.where(count > 0, (1.0 + distance.float()).reciprocal(), 0.0),
            "seen_weight": (eq * (position.float() / width)).sum(dim=2)}


def test_seen_columns_reduced_over_the_sessions_equal_those_over_the_candidates() -> None:
    """Repeats, one-event and all-padding sessions, a row without candidates, empty slots (id 0, which matches the
    padding), candidates absent from their session, width 1 and the pipeline's 20."""
    g = torch.Generator().manual_seed(0)
    cases = [(torch.tensor([[0, 0, 5, 5, 7], [0, 0, 0, 0, 9], [0, 0, 0, 0, 0], [3, 3, 3, 3, 3]]),
              torch.tensor([[5, 7, 9, 0], [9, 0, 0, 0], [4, 0, 0, 0], [0, 0, 0, 0]])),
             (torch.tensor([[6], [0]]), torch.tensor([[6, 2, 0], [0, 6, 1]]))]
    for width in (1, 3, 20):
        lengths = torch.randint(0, width + 1, (64,), generator=g)
        items = torch.randint(2, 12, (64, width), generator=g)
        items = torch.where(torch.arange(width) >= width - lengths.unsqueeze(1), items, 0)  # right-aligned
        cand = torch.randint(0, 16, (64, 30), generator=g)
        cases.append((items, torch.where(torch.rand(64, 30, generator=g) < 0.2, 0, cand)))
    for items, cand in cases:
        ordered, where = torch.sort(items, dim=1)
        got, want = _seen(items, cand, ordered, where), plain_seen(items, cand)
        for name in want:  # the same floats, zero signs included
            assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
            assert torch.equal(got[name].signbit(), want[name].signbit()), name


@pytest.mark.parametrize("per_session_rows", [0, 10**9])
def test_the_last_event_times_features_computed_once_per_session_equal_the_ops_on_every_row(
    monkeypatch: pytest.MonkeyPatch, per_session_rows: int,
) -> None:
    """From `PER_SESSION_ROWS` candidate rows, `transform` computes the hour and weekday of each session's last event
    once per session that has a candidate and spreads them to its rows: the op's values on every row either way, and
    a session without candidates is not read (its times may be anything, NaN included)."""
    import numpy as np

    from sessrec.features import CyclicTime
    from sessrec.pipeline import candidate_features

    monkeypatch.setattr(candidate_features, "PER_SESSION_ROWS", per_session_rows)
    from sessrec.pipeline.candidate_features import CandidateFeatures
    from sessrec.pipeline.candidates import Candidates, RequestSessions

    day = 1_700_000_000.0
    items = torch.tensor([[0, 5, 6], [0, 0, 7], [4, 4, 4], [0, 0, 3]])
    times = torch.tensor([[0, day, day + 4000], [0, 0, day + 90_000], [day, day + 1, day + 7 * 3600.5], [0, 0, 0]],
                         dtype=torch.float64)
    cands = Candidates(torch.tensor([[5, 8, 0], [0, 0, 0], [9, 4, 2], [6, 0, 0]]))
    features = CandidateFeatures(groups=["time", "context"]).fit_statistics(items, 10)
    sessions = RequestSessions(items, times=times)
    features.fit(sessions, cands, features.raw(sessions, cands, {}), labels=torch.zeros(4, 3))
    out = features.transform(sessions, cands, {})
    row = np.nonzero(cands.valid.numpy())[0]
    want = CyclicTime("timestamp").transform({"timestamp": times[:, -1].numpy()[row]})
    for name in ("hour_sin", "hour_cos", "weekday_sin", "weekday_cos"):
        got = out.dense[..., out.names.index(f"time_{name}")][cands.valid]
        assert torch.equal(got, torch.from_numpy(getattr(want, name).astype(np.float32))), name
    times[1] = float("nan")  # no candidate: not read
    again = features.transform(RequestSessions(items, times=times), cands, {})
    assert torch.equal(again.dense[cands.valid], out.dense[cands.valid])
