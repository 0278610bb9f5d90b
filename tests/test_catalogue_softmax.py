"""`catalogue_cross_entropy` against the cross-entropy of the scores autograd builds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sessrec.models import SessionModel, XLNetEncoder
from sessrec.models.catalogue_softmax import BLOCK, catalogue_cross_entropy
from sessrec.tasks.losses import FullSoftmax, smoothed_cross_entropy


def reference(hidden, table, bias, targets, temperature, smoothing):
    return smoothed_cross_entropy(torch.addmm(bias, hidden, table.T) / temperature, targets, smoothing)


def leaves(n: int, v: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden, table = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g) * 0.5
    bias = torch.randn(v, generator=g)
    bias[:2] = float("-inf")  # padding and OOV
    targets = torch.randint(2, v, (n,), generator=g)
    return hidden, table, bias, targets


@pytest.mark.parametrize(("v", "temperature", "smoothing"), [(BLOCK * 2 + 37, 1.0, 0.0), (50, 0.5, 0.0), (BLOCK + 1, 2.0, 0.1)])
def test_loss_and_gradients_match_autograd(v, temperature, smoothing):
    hidden, table, bias, targets = leaves(23, v, 8)
    grads = []
    for fn in (reference, catalogue_cross_entropy):
        leaf = [t.clone().requires_grad_() for t in (hidden, table, bias)]
        loss = fn(*leaf, targets, temperature, smoothing)
        loss.backward()
        grads.append((loss.detach(), *(t.grad for t in leaf)))
    (ref_loss, *ref_grads), (loss, *fused_grads) = grads
    assert torch.allclose(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for got, want in zip(fused_grads, ref_grads):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)
    assert torch.equal(fused_grads[2][:2], torch.zeros(2))  # never-target ids get no bias gradient


def test_known_value_of_uniform_scores():
    # all scores equal: every row's loss is log(number of finite items)
    hidden, table, bias = torch.zeros(3, 4), torch.zeros(10, 4), torch.zeros(10)
    bias[0] = float("-inf")
    loss = catalogue_cross_entropy(hidden, table, bias, torch.tensor([1, 5, 9]))
    assert loss.item() == pytest.approx(torch.log(torch.tensor(9.0)).item(), rel=1e-6)


def test_second_backward_and_empty_batch_are_refused():
    hidden, table, bias, targets = leaves(4, 30, 4)
    loss = catalogue_cross_entropy(hidden.requires_grad_(), table, bias, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran a second time"):
        loss.backward()
    with pytest.raises(ValueError, match="at least one row"):
        catalogue_cross_entropy(torch.zeros(0, 4), table, bias, targets[:0])


@pytest.mark.parametrize("score_scale", [None, 5.0])
def test_full_softmax_is_the_cross_entropy_of_the_model_scores(score_scale):
    torch.manual_seed(0)
    model = SessionModel(num_items=40, encoder=XLNetEncoder(d_model=8, n_head=2, n_layer=1), score_scale=score_scale,
                         output_transform=True)
    hidden, targets = torch.randn(6, 8), torch.randint(2, 40, (6,))
    loss = FullSoftmax(label_smoothing=0.2, temperature=0.7)(model, hidden, targets)
    loss.backward()
    fused = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    want = smoothed_cross_entropy(model.score(hidden) / 0.7, targets, 0.2)
    want.backward()
    assert torch.allclose(loss, want, atol=1e-6)
    assert fused.keys() == {name for name, p in model.named_parameters() if p.grad is not None}
    for name, grad in fused.items():
        assert torch.allclose(grad, dict(model.named_parameters())[name].grad, rtol=1e-4, atol=1e-6), name
    assert torch.allclose(F.cross_entropy(model.score(hidden), targets), model.catalogue_loss(hidden, targets), atol=1e-6)


@pytest.mark.parametrize(("temperature", "smoothing"), [(1.0, 0.0), (0.5, 0.1)])
def test_autocast_runs_the_products_in_bfloat16_and_the_rest_in_float32(temperature, smoothing):
    hidden, table, bias, targets = leaves(9, BLOCK * 2 + 37, 8)
    grads = {}
    for name in ("fused", "rounded", "float32"):
        leaf = [t.clone().requires_grad_() for t in (hidden, table, bias)]
        if name == "fused":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = catalogue_cross_entropy(*leaf, targets, temperature, smoothing)
        elif name == "rounded":  # the same numbers by autograd: the product of the bfloat16 inputs, rounded to bfloat16
            h, t, b = leaf
            product = (h.bfloat16() @ t.bfloat16().T).float()
            loss = smoothed_cross_entropy((product + b) / temperature, targets, smoothing)
        else:
            loss = reference(*leaf, targets, temperature, smoothing)
        loss.backward()
        grads[name] = (loss.detach(), *(t.grad for t in leaf))
    fused, rounded, full = grads["fused"], grads["rounded"], grads["float32"]
    assert fused[0].dtype == torch.float32 and all(g.dtype == torch.float32 for g in fused[1:])
    assert torch.allclose(fused[0], rounded[0], rtol=1e-6, atol=1e-6)
    for got, want in zip(fused[1:], rounded[1:]):
        assert torch.allclose(got, want, rtol=1e-2, atol=1e-4)
    assert fused[0] != full[0] and abs(fused[0] - full[0]) < 0.05  # bfloat16 products: near float32's, not equal
    assert torch.equal(fused[3][:2], torch.zeros(2))


def test_buffers_in_flight_and_reused_give_the_same_numbers():
    # two graphs alive at once (two buffers), then more rows than the kept buffer holds
    sizes = [(7, 0), (5, 1), (40, 2)]
    leaves_of = [leaves(n, 300, 6, seed) for n, seed in sizes]
    losses = [catalogue_cross_entropy(h.requires_grad_(), t, b, y) for h, t, b, y in leaves_of[:2]]
    for loss, (h, *_rest) in zip(losses, leaves_of[:2]):
        loss.backward()
    losses.append(catalogue_cross_entropy(leaves_of[2][0].requires_grad_(), *leaves_of[2][1:]))
    losses[2].backward()
    for loss, (h, table, bias, targets) in zip(losses, leaves_of):
        fresh = h.detach().clone().requires_grad_()
        want = F.cross_entropy(torch.addmm(bias, fresh, table.T), targets)
        want.backward()
        assert torch.allclose(loss, want, atol=1e-6) and torch.allclose(h.grad, fresh.grad, atol=1e-7)
