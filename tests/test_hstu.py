"""HSTUEncoder: one layer against its equations by hand, the buckets, causality, padding, jagged == padded,
the time bias, training with CLM and a full softmax, a model directory round trip, and a task that
trains and evaluates on the batches' event times."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from sessrec.artifacts import Inference, SessionRecommender
from sessrec.data import Schema, SessionBatch, SessionSplits
from sessrec.data.sources import SessionSource
from sessrec.data.vocab import ItemVocab
from sessrec.models import CausalLanguageModeling, HSTUEncoder, SASRecEncoder, SessionModel
from sessrec.models.hstu import position_buckets, time_buckets
from sessrec.models.session_model import EVENT_TIMES
from sessrec.tasks.losses import FullSoftmax

torch.set_num_threads(1)


def encoder(seed=0, biases=True, **kwargs) -> HSTUEncoder:
    """A 2-layer d=16 encoder in eval mode; with `biases`, random position and time tables (they start at zero)."""
    torch.manual_seed(seed)
    enc = HSTUEncoder(**{"d_model": 16, "n_head": 2, "n_layer": 2, "dropout": 0.0, **kwargs}).eval()
    if biases:
        with torch.no_grad():
            for layer in enc.layers:
                layer.position_bias.normal_()
                layer.time_bias.normal_()
    return enc


def padded(seed=0):
    """(5, 7, 16) embeddings, left padding of 0..7 positions filled with noise, the real mask, event times."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 7, 16, generator=g)
    lengths = torch.tensor([7, 4, 1, 3, 0])
    mask = torch.arange(7)[None, :] >= 7 - lengths[:, None]
    times = 1.7e9 + torch.cumsum(torch.rand(5, 7, generator=g, dtype=torch.float64) * 5000, dim=1)
    return x, mask, lengths, times


def test_buckets_by_hand():
    # exact below 16; then 16 + floor(log(d / 16) / log(128 / 16) * 16): 32 -> 21, 127 -> 31; capped at 31
    d = torch.tensor([0, 1, 15, 16, 17, 32, 127, 128, 1000])
    assert position_buckets(d, 32, 128).tolist() == [0, 1, 15, 16, 16, 21, 31, 31, 31]
    # floor(log2(max(|dt|, 1))): 3600 s -> 11, 86400 s -> 16, -7200 s -> 12; capped at 31
    dt = torch.tensor([0.0, 0.5, 1.0, 1.9, 2.0, 3.0, 4.0, 3600.0, 86400.0, -7200.0, 1e12], dtype=torch.float64)
    assert time_buckets(dt, 32).tolist() == [0, 0, 0, 0, 1, 1, 2, 11, 16, 12, 31]


def test_one_layer_by_hand():
    """B = 1, L = 3, D = 4, one head, fixed weights: U, V, Q, K = split(SiLU(f1(LN(X)))),
    A[i, j] = SiLU(q_i . k_j + p[i - j]) / (i + 1) for j <= i, Y = f2(LN(A V) * U) + X, then the final LayerNorm."""
    enc = HSTUEncoder(d_model=4, n_head=1, n_layer=1, dropout=0.0, layer_norm_eps=1e-6).eval()
    layer = enc.layers[0]
    w1 = torch.linspace(-1.0, 1.0, 64).view(16, 4)
    w2 = torch.linspace(0.5, -0.5, 16).view(4, 4)
    with torch.no_grad():
        layer.f1.weight.copy_(w1)
        layer.f1.bias.fill_(0.1)
        layer.f2.weight.copy_(w2)
        layer.f2.bias.zero_()
        layer.position_bias.zero_()
        layer.position_bias[:3, 0] = torch.tensor([0.5, -0.25, 1.0])  # distance 0, 1, 2
    x = torch.tensor([[[1.0, 0.0, -1.0, 2.0], [0.5, 0.5, 0.0, -1.0], [-2.0, 1.0, 1.0, 0.0]]])

    def ln(v):
        return (v - v.mean()) / torch.sqrt(v.var(unbiased=False) + 1e-6)

    def silu(z):
        return z / (1 + torch.exp(-z))

    rows = []
    for i in range(3):
        proj = [silu(w1 @ ln(x[0, j]) + 0.1) for j in range(3)]  # (16,) each: U, V, Q, K of position j
        u_i, q_i = proj[i][0:4], proj[i][8:12]
        av = torch.zeros(4)
        for j in range(i + 1):
            v_j, k_j = proj[j][4:8], proj[j][12:16]
            a = silu(q_i @ k_j + [0.5, -0.25, 1.0][i - j]) / (i + 1)
            av = av + a * v_j
        y = w2 @ (ln(av) * u_i) + x[0, i]
        rows.append(ln(y))
    expected = torch.stack(rows)[None]
    with torch.no_grad():
        for jagged in (True, False):
            enc.jagged = jagged
            torch.testing.assert_close(enc(x, torch.ones(1, 3, dtype=torch.bool)), expected, atol=1e-5, rtol=1e-5)


def test_shape_finite_and_causal_flag():
    x, mask, _, times = padded()
    enc = encoder()
    with torch.no_grad():
        for jagged in (True, False):
            enc.jagged = jagged
            out = enc(x, mask, times)
            assert out.shape == (5, 7, 16) and torch.isfinite(out).all() and (out[~mask] == 0).all()
    assert HSTUEncoder.causal is True and enc.uses_times is True and enc.d_model == 16


def test_the_default_path_is_jagged_on_the_cpu_and_padded_elsewhere(monkeypatch):
    """`jagged=None` picks by the device of the embeddings ("meta" stands for an accelerator here)."""
    taken = []
    monkeypatch.setattr(HSTUEncoder, "_jagged", lambda self, *a: taken.append("jagged") or a[0])
    monkeypatch.setattr(HSTUEncoder, "_padded", lambda self, *a: taken.append("padded") or a[0])
    enc = encoder()
    assert enc.jagged is None
    for device in ("cpu", "meta"):
        enc(torch.zeros(2, 3, 16, device=device), torch.ones(2, 3, dtype=torch.bool, device=device))
    enc.jagged = False
    enc(torch.zeros(2, 3, 16), torch.ones(2, 3, dtype=torch.bool))
    assert taken == ["jagged", "padded", "padded"]


@pytest.mark.parametrize("jagged", [True, False])
def test_causal_a_later_item_changes_no_earlier_output(jagged):
    enc = encoder(jagged=jagged)
    x, _, _, times = padded(seed=1)
    mask = torch.ones(5, 7, dtype=torch.bool)
    changed, later = x.clone(), times.clone()
    changed[:, 4:] = torch.randn(5, 3, 16)
    later[:, 4:] += 1e6
    with torch.no_grad():
        a, b = enc(x, mask, times), enc(changed, mask, later)
        # nor does one more item: row i is normalised by the items it reads, not by the session's length
        shorter = enc(x[:, :4], mask[:, :4], times[:, :4])
    torch.testing.assert_close(a[:, :4], b[:, :4])
    torch.testing.assert_close(a[:, :4], shorter, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("jagged", [True, False])
def test_left_padding_does_not_change_real_positions(jagged):
    enc = encoder(jagged=jagged)
    x, mask, lengths, times = padded()
    with torch.no_grad():
        out = enc(x, mask, times)
        for row, n in enumerate(lengths.tolist()):
            alone = enc(x[row : row + 1, 7 - n :], mask[row : row + 1, 7 - n :], times[row : row + 1, 7 - n :])
            torch.testing.assert_close(out[row, 7 - n :], alone[0], atol=1e-5, rtol=1e-4)
        wider = enc(torch.cat([torch.randn(5, 3, 16), x], 1), torch.cat([torch.zeros(5, 3, dtype=torch.bool), mask], 1),
                    torch.cat([torch.zeros(5, 3, dtype=torch.float64), times], 1))
        torch.testing.assert_close(wider[:, 3:], out, atol=1e-5, rtol=1e-4)
        noisier, odd_times = x.clone(), times.clone()
        noisier[~mask] = 100.0 * torch.randn(int((~mask).sum()), 16)
        odd_times[~mask] = -5e9
        torch.testing.assert_close(enc(noisier, mask, odd_times), out, atol=1e-5, rtol=1e-4)


def test_jagged_equals_padded_outputs_and_gradients():
    x, mask, _, times = padded(seed=2)
    results = {}
    for jagged in (True, False):
        enc = encoder(seed=5, jagged=jagged)
        inputs = x.clone().requires_grad_(True)
        out = enc(inputs, mask, times)
        (out * torch.linspace(-1, 1, 16)).sum().backward()
        results[jagged] = out.detach(), inputs.grad, {n: p.grad for n, p in enc.named_parameters()}
    (out_j, grad_j, params_j), (out_p, grad_p, params_p) = results[True], results[False]
    torch.testing.assert_close(out_j, out_p, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_j, grad_p, atol=1e-5, rtol=1e-5)
    for name, grad in params_p.items():
        torch.testing.assert_close(params_j[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    assert params_p["layers.0.time_bias"].abs().sum() > 0  # the time table is trained where times are given


def test_time_bias_acts_only_through_time_differences():
    x, mask, _, times = padded(seed=3)
    with torch.no_grad():
        fresh = encoder(biases=False)  # the tables start at zero: times change nothing yet
        torch.testing.assert_close(fresh(x, mask, times), fresh(x, mask))
        enc = encoder()
        base = enc(x, mask, times)
        torch.testing.assert_close(enc(x, mask, times + 12345.0), base)  # a shift of every time: same differences
        assert not torch.allclose(enc(x, mask), base)  # without times the time term is off
        slower = times.clone()
        slower[:, 5:] += 86400.0  # a day passes before the 6th position: the gaps to it and after it change
        changed = enc(x, mask, slower)
        torch.testing.assert_close(changed[:, :5], base[:, :5])
        assert not torch.allclose(changed[0, 5:], base[0, 5:])


def test_session_model_passes_event_times_only_to_an_encoder_that_uses_them():
    items = torch.tensor([[0, 0, 3, 4, 5], [2, 9, 3, 7, 11]])
    times = torch.tensor([[0, 0, 1e9, 1e9 + 60, 1e9 + 7200], [1e9, 1e9 + 1, 1e9 + 2, 1e9 + 3e5, 1e9 + 3e5 + 5]],
                         dtype=torch.float64)
    torch.manual_seed(0)
    model = SessionModel(20, encoder(), max_length=5).eval()
    with torch.no_grad():
        plain, timed = model(SessionBatch(items)), model(SessionBatch(items, times=times))
        torch.testing.assert_close(timed, model(items, features={EVENT_TIMES: times}))
        assert not torch.allclose(plain, timed)
        sasrec = SessionModel(20, SASRecEncoder(d_model=16, n_head=2, n_layer=1), max_length=5).eval()
        torch.testing.assert_close(sasrec(SessionBatch(items, times=times)), sasrec(items))  # never given times


def test_trains_with_clm_and_a_full_softmax():
    """A chain a -> a + 1 (a ring over 18 items): 60 steps of CLM with the full softmax bring the loss
    from ln(18) ~ 2.9 below 0.5, and the successor is ranked first, read as at evaluation."""
    torch.manual_seed(0)
    model = SessionModel(20, HSTUEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=6, dropout=0.0)
    objective, loss_fn = CausalLanguageModeling(), FullSoftmax()
    objective.bind(model)
    starts = torch.randint(0, 18, (256,))
    items = 2 + (starts[:, None] + torch.arange(6)[None, :]) % 18  # (256, 6) ids 2..19
    items[::3, :2] = 0  # some shorter, left-padded sessions
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(60):
        out = objective.training_output(model, items)
        loss = loss_fn(model, out.hidden, out.targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 2.5 and losses[-1] < 0.5, (losses[0], losses[-1])
    model.eval()
    with torch.no_grad():
        pred = model(torch.tensor([[0, 4, 5, 6], [9, 10, 11, 12]]), objective).argmax(dim=1)
    assert pred.tolist() == [7, 13]


def test_saves_and_loads_as_a_model_directory(tmp_path):
    torch.manual_seed(0)
    model = SessionModel(20, encoder(n_layer=1, jagged=False), max_length=5).eval()
    vocab = ItemVocab(pa.array(np.arange(100, 118)), np.arange(18, 0, -1))
    saved = SessionRecommender(model, CausalLanguageModeling(), vocab, Inference(max_length=5, top_k=5))
    loaded = SessionRecommender.from_pretrained(saved.save_pretrained(tmp_path / "model")).model
    assert isinstance(loaded.encoder, HSTUEncoder) and loaded.encoder.jagged is False and loaded.encoder.n_head == 2
    items = torch.tensor([[0, 0, 3, 4, 5], [2, 9, 3, 7, 11]])
    times = torch.tensor([[0, 0, 1.0, 90.0, 4000.0], [1.0, 2.0, 3.0, 1e4, 1e5]], dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(SessionBatch(items, times=times)), model(SessionBatch(items, times=times)))
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_bad_arguments_fail_with_one_line():
    with pytest.raises(ValueError, match="multiple of n_head"):
        HSTUEncoder(d_model=10, n_head=3)
    with pytest.raises(ValueError, match="num_position_buckets"):
        HSTUEncoder(num_position_buckets=1)
    with pytest.raises(ValueError, match="times has shape"):
        HSTUEncoder(d_model=8, n_head=2)(torch.zeros(1, 3, 8), torch.ones(1, 3, dtype=torch.bool), torch.zeros(1, 4))


@pytest.mark.parametrize("jagged", [True, False])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_an_event_time_that_is_no_number_is_refused_naming_its_place(jagged, bad):
    """A NaN or infinite time of a real item has no time bucket: one line naming the value and its (row, column),
    not an index error in the bucket lookup (jagged) or a bias read past its table (padded); padding is not read."""
    x, mask, _, times = padded()
    enc = encoder(jagged=jagged)
    times[~mask] = float("nan")
    with torch.no_grad():
        assert torch.isfinite(enc(x, mask, times)).all()
        times[3, 5] = bad
        with pytest.raises(ValueError, match=rf"^times: event time {bad} at \[3, 5\] of a real item is not a finite number$"):
            enc(x, mask, times)


def test_epoch_seconds_in_float32_are_refused_and_short_times_in_float32_are_read() -> None:
    """float32 holds whole seconds exactly up to 2^24: epoch seconds in it are multiples of 128 s, whose differences
    fall in other time buckets than the float64 ones; times counted from a session's start fit."""
    x, mask, _, times = padded()
    enc = encoder()
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"^times: torch\.float32 event times reach 17\d{8} s, beyond the 16777216 "):
            enc(x, mask, times.float())
        relative = (times - 1.7e9).masked_fill(~mask, 0)  # at most 7 x 5,000 s
        torch.testing.assert_close(enc(x, mask, relative.float()), enc(x, mask, relative), rtol=0, atol=0)


def hstu_task(num_items: int = 20):
    from sessrec.tasks import NextItemTask

    torch.manual_seed(0)
    return NextItemTask(num_items=num_items, max_length=6, encoder=HSTUEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0),
                        objective=CausalLanguageModeling(), loss=FullSoftmax(), dropout=0.0)


ITEMS = torch.tensor([[0, 0, 3, 4, 5, 6], [2, 9, 3, 7, 11, 12], [0, 8, 9, 10, 11, 4]], dtype=torch.int32)
TIMES = torch.tensor([[0, 0, 1e9, 1e9 + 60, 1e9 + 7200, 1e9 + 7300],
                      [1e9, 1e9 + 1, 1e9 + 2, 1e9 + 3e5, 1e9 + 3e5 + 5, 1e9 + 4e5],
                      [0, 1e9, 1e9 + 30, 1e9 + 90, 1e9 + 1e4, 1e9 + 2e4]], dtype=torch.float64)


def test_task_trains_the_time_bias_on_the_batch_times_only():
    grads = {}
    for timed in (True, False):
        task = hstu_task()
        assert task.uses_times
        task.training_step(SessionBatch(ITEMS, times=TIMES if timed else None), 0).backward()
        grads[timed] = task.model.encoder.layers[0].time_bias.grad
    assert grads[True].abs().sum() > 0
    assert grads[False] is None or not grads[False].any()  # without times the table takes no part


def test_task_evaluates_and_scores_with_the_batch_times():
    task = hstu_task().eval()
    with torch.no_grad():
        task.model.encoder.layers[0].time_bias.normal_()
        targets = torch.tensor([7, 13, 5])
        timed, plain = SessionBatch(ITEMS, targets, times=TIMES), SessionBatch(ITEMS, targets)
        scores = task.model(ITEMS, task.objective, {EVENT_TIMES: TIMES})
        torch.testing.assert_close(task.validation_step(timed, 0), torch.nn.functional.cross_entropy(scores, targets))
        assert not torch.allclose(task.validation_step(plain, 0), task.validation_step(timed, 0))
        torch.testing.assert_close(task(timed), scores)
        top = task.predict_step(timed, 0)  # 18 recommendable items (ids 2..19), fewer than top_k
        torch.testing.assert_close(top.scores, scores.topk(18).values)


class TimedLog(SessionSource):
    """Tiny splits; with `times`, event j of session r happens at 1e9 + 1e4 r + 7 j^3 seconds (gaps of 7 s to 10 min)."""

    def __init__(self, times: bool) -> None:
        self.times = times

    def load(self) -> SessionSplits:
        def table(sessions, first):
            cols = {"session_id": list(range(first, first + len(sessions))), "item_id": sessions}
            if self.times:
                cols["timestamp"] = [[1e9 + 1e4 * r + 7.0 * j**3 for j in range(len(s))] for r, s in enumerate(sessions)]
            return pa.table(cols)

        train = [[10 + (r + j) % 9 for j in range(3 + r % 4)] for r in range(12)]
        held_out = [[11, 12, 13, 14], [15, 16, 17], [12, 13, 14, 15, 16]]
        return SessionSplits(table(train, 0), table(held_out, 100), table(held_out, 200), source="log")


def test_fit_and_validate_give_the_encoder_the_data_event_times():
    """Through Lightning: the data module's loaders carry the times because the task reads them (times=None); the
    encoder records whether it was trained with them. A model trained with times refuses validation without them,
    one trained without them reads none of the times it is given."""
    import pytorch_lightning as pl

    from sessrec.tasks import SessionDataModule

    trainer = lambda: pl.Trainer(max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                                 enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    tasks = {}
    for timed in (True, False):
        data = SessionDataModule(TimedLog(timed), max_length=6, batch_size=64)
        tasks[timed] = hstu_task(data.num_items)
        trainer().fit(tasks[timed], data)
        assert tasks[timed].model.encoder.trained_with_times is timed and tasks[timed].model.needs_times is timed
    learned = {timed: task.model.encoder.layers[0].time_bias for timed, task in tasks.items()}
    assert learned[True].abs().sum() > 0 and not learned[False].any()  # one step moves the table only with times
    assert tasks[True].uses_times and not tasks[False].uses_times
    validate = lambda task, times: pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                                              accelerator="cpu").validate(
        task, SessionDataModule(TimedLog(True), max_length=6, eval_batch_size=8, times=times), verbose=False)[0]["val/loss"]
    with torch.no_grad():
        tasks[False].model.encoder.layers[0].time_bias.normal_()  # were they read, they would change the scores
    assert validate(tasks[False], None) == validate(tasks[False], True)
    with pytest.raises(ValueError, match=r"^log \(valid split\): the model \(or a teacher it distils from\) was trained "
                                         r"with event times and these batches carry none \(--data\.times false\)"):
        validate(tasks[True], False)


def _timed_hstu():
    """A tiny HSTU session model whose time bias is nonzero (a trained one's): it reads event times."""
    from sessrec.models import SessionModel

    torch.manual_seed(0)
    model = SessionModel(num_items=30, encoder=HSTUEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=7)
    with torch.no_grad():
        model.encoder.layers[0].time_bias.normal_()
    return model


def test_the_pipeline_retriever_gives_hstu_the_request_times():
    """A served HSTU reads the request's event times: the retriever's query equals the model's own reading with
    them, and differs from the one without (the time bias is nonzero)."""
    from sessrec.models import CausalLanguageModeling
    from sessrec.models.objective import EVENT_TIMES
    from sessrec.pipeline.candidates import RequestSessions
    from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever

    model = _timed_hstu()
    retriever = SessionModelRetriever(model.eval())
    items = torch.tensor([[0, 5, 6, 7], [3, 4, 5, 6]])
    times = torch.tensor([[0.0, 100.0, 5e3, 9e4], [10.0, 20.0, 1e5, 2e6]], dtype=torch.float64)
    with_times = retriever.query_vectors(RequestSessions(items, times=times))
    without = retriever.query_vectors(RequestSessions(items))
    with torch.no_grad():
        expected = model.output_transform(CausalLanguageModeling().next_item_hidden(model, items, {EVENT_TIMES: times}))
    torch.testing.assert_close(with_times[:, :-1], expected)
    assert not torch.allclose(with_times, without, atol=1e-4)


def test_a_pipeline_ranker_without_time_features_scores_an_hstu_retriever_with_the_sessions_times():
    """A ranker fitted without time features dropped the sessions' times before its features were built, so the score
    of an HSTU retriever trained with times (one of those features) was refused as given no times, unless the
    retrieval stage had cached that retriever's query for these very sessions. The times reach it: the same scores."""
    pytest.importorskip("lightgbm")
    from test_pipeline_sessions import MAX_LENGTH, HandSessions

    from sessrec.pipeline.candidate_features import CandidateFeatures
    from sessrec.pipeline.candidates import RequestSessions
    from sessrec.pipeline.pipeline import Pipeline
    from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever
    from sessrec.pipeline.scoring import GBDTScorer
    from sessrec.pipeline_training import fitting
    from sessrec.tasks import SessionDataModule

    dm = SessionDataModule(source=HandSessions(), max_length=MAX_LENGTH)
    pairs, test = dm.pairs("valid", "all_prefixes"), dm.pairs("test", "all_prefixes")
    torch.manual_seed(0)
    model = SessionModel(dm.num_items, HSTUEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=MAX_LENGTH)
    objective = CausalLanguageModeling()
    objective.bind(model)
    out = objective.training_output(model, pairs.items.long(), features={EVENT_TIMES: pairs.times})
    FullSoftmax()(model, out.hidden, out.targets).backward()
    with torch.no_grad():
        model.encoder.layers[0].time_bias.normal_()
    features = CandidateFeatures(groups=["retrievers", "popularity"]).fit_statistics(dm.tensors("train")[0], dm.num_items)
    pipe = Pipeline(dm.vocab, {"hstu": (SessionModelRetriever(model.eval(), objective), 8)}, max_length=MAX_LENGTH,
                    max_candidates=8, features=features)
    fitting.fit_ranker(pipe, pairs, GBDTScorer(max_rounds=5, min_data_in_leaf=1, threads=1))
    assert pipe.time_features == [] and "hstu_score" in pipe.features.names
    retrieved = RequestSessions(test.items.long(), times=test.times)
    cands = pipe.candidates(retrieved)
    fresh = RequestSessions(test.items.long(), times=test.times)  # no query cached by a retrieval stage
    torch.testing.assert_close(pipe.score(fresh, cands).scores, pipe.score(retrieved, cands).scores)


def test_a_served_hstu_model_reads_the_request_times():
    """`SessionModelService` (what `sessrec serve` runs for a model directory) scores with the request's times:
    its scores equal the model's own with those times, and differ from the scores without them."""
    import pyarrow as pa

    from sessrec.data import ItemVocab
    from sessrec.models import CausalLanguageModeling
    from sessrec.models.objective import EVENT_TIMES
    from sessrec.pipeline.request import check_request
    from sessrec.serving.recommender import SessionModelService

    model = _timed_hstu()
    vocab = ItemVocab.fit(pa.array(list(range(100, 128))))
    served = SessionModelService(SessionRecommender(model.eval(), CausalLanguageModeling(), vocab, Inference(7)))
    sessions, times = [[101, 102, 103], [110, 111, 112, 113]], [[1e9, 1e9 + 60, 1e9 + 9e4], [1e9, 1e9 + 1, 1e9 + 2, 2e9]]
    request = served.encode(check_request(sessions, times=times))  # served when its last event happened
    with_times, without = served.recommend_batch(request, k=5), served.recommend_batch(served.encode(check_request(sessions)), k=5)
    with torch.no_grad():
        hidden = CausalLanguageModeling().next_item_hidden(model, request.items, {EVENT_TIMES: request.times})
        expected = model.score(hidden).topk(5, dim=1)
    torch.testing.assert_close(with_times.scores, expected.values)
    assert not torch.allclose(with_times.scores, without.scores, atol=1e-4)


def _trained(timed: bool) -> SessionRecommender:
    """A tiny HSTU recommender after one training step with (or without) the event times of `ITEMS`, its time table
    then drawn at random (were the times read, they would change the scores)."""
    torch.manual_seed(0)
    model = SessionModel(20, HSTUEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=6, dropout=0.0)
    objective = CausalLanguageModeling()
    objective.bind(model)
    out = objective.training_output(model, ITEMS.long(), features={EVENT_TIMES: TIMES} if timed else None)
    FullSoftmax()(model, out.hidden, out.targets).backward()
    with torch.no_grad():
        model.encoder.layers[0].time_bias.normal_()
    vocab = ItemVocab(pa.array(np.arange(100, 118)), np.arange(18, 0, -1))
    return SessionRecommender(model.eval(), objective, vocab, Inference(max_length=6, top_k=5))


def test_a_model_trained_with_times_records_it_and_refuses_to_be_read_without_them(tmp_path):
    """Trained with event times, the model directory says so; read without times (a file without a time column,
    a served request or a batch without them) it is refused in one line, not scored with the time term off."""
    import pyarrow.parquet as pq

    from sessrec.pipeline.candidates import RequestSessions
    from sessrec.pipeline.request import check_request
    from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever
    from sessrec.scoring import predict_file
    from sessrec.serving.recommender import SessionModelService

    directory = _trained(timed=True).save_pretrained(tmp_path / "model")
    loaded = SessionRecommender.from_pretrained(directory)
    assert loaded.model.encoder.trained_with_times is True and loaded.model.needs_times and loaded.model.uses_times
    refusal = r"^HSTUEncoder: this model was trained with event times and is given none: give the sessions"
    with torch.no_grad(), pytest.raises(ValueError, match=refusal):
        loaded.model(SessionBatch(ITEMS))
    with pytest.raises(ValueError, match=r"^this model was trained with event times: give the request's times"):
        SessionModelService(loaded).encode(check_request([[101, 102, 103]]))
    with pytest.raises(ValueError, match=r"^this retriever's HSTUEncoder was trained with event times and these sessions "):
        SessionModelRetriever(loaded.model, loaded.objective).query_vectors(RequestSessions(ITEMS.long()))
    sessions = tmp_path / "sessions.parquet"
    pq.write_table(pa.table({"session_id": [1, 1, 2], "item_id": [101, 102, 103]}), sessions)
    with pytest.raises(ValueError, match=rf"^{sessions}: the model was trained with event times and these sessions have "
                                         r"no 'timestamp' column"):
        predict_file(directory, sessions, tmp_path / "recs.parquet")
    with pytest.raises(ValueError, match=rf"^{sessions}: the model was trained with event times and these sessions have "
                                         r"no time column \(the schema's timestamp is null\)"):
        predict_file(directory, sessions, tmp_path / "recs.parquet", schema=Schema(timestamp=None))
    timed = tmp_path / "timed.parquet"
    pq.write_table(pa.table({"session_id": [1, 1, 2], "item_id": [101, 102, 103], "timestamp": [1.7e9, 1.7e9 + 60, 1.7e9]}),
                   timed)
    with pytest.raises(ValueError, match=rf"^{timed}: the model was trained with event times and these sessions have "
                                         r"none \(--data.times false\); .* and set --data.times null$"):
        predict_file(directory, timed, tmp_path / "recs.parquet", times=False)  # sessrec predict --engine dask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "sessions.parquet", "timed.parquet"]  # nothing written


def test_a_model_trained_without_times_ignores_the_times_it_is_given(tmp_path):
    """Trained without event times, the model directory says so: the times of a batch are not read (the same scores
    as without them, whatever its time table holds), and nothing passes them (`uses_times` is false)."""
    loaded = SessionRecommender.from_pretrained(_trained(timed=False).save_pretrained(tmp_path / "model"))
    assert loaded.model.encoder.trained_with_times is False and not loaded.model.uses_times and not loaded.model.needs_times
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ITEMS, loaded.objective, {EVENT_TIMES: TIMES}),
                                   loaded.model(ITEMS, loaded.objective))


def test_training_on_without_times_is_refused():
    """An encoder trained with times refuses a training batch without them."""
    model = _trained(timed=True).model.train()
    with pytest.raises(ValueError, match=r"^HSTUEncoder: this model was trained with event times and is given none"):
        model(ITEMS)
