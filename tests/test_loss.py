import math

import pytest
import torch

from epr.loss import contrastive_loss, grad_cache_backward


def test_two_by_two_hand_computed():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # docs: pos_0, neg_0, pos_1, neg_1  (the positive of query i is row 2i, as the docstring says)
    d = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.5, 3.0], [1.0, 1.0]])
    s0 = [2.0, 0.0, 0.5, 1.0]  # q0 . d
    s1 = [0.0, 1.0, 3.0, 1.0]  # q1 . d
    expect = (
        -(s0[0] - math.log(sum(math.exp(x) for x in s0))) - (s1[2] - math.log(sum(math.exp(x) for x in s1)))
    ) / 2
    assert contrastive_loss(q, d).item() == pytest.approx(expect, rel=1e-6)
    assert contrastive_loss(q, d, temperature=0.5).item() == pytest.approx(
        contrastive_loss(q * 2, d).item(), rel=1e-6
    )


def test_offset_places_local_queries_in_gathered_docs():
    q = torch.tensor([[0.0, 1.0]])  # the second process's only query: its positive is gathered row 2
    d = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.5, 3.0], [1.0, 1.0]])
    expect = -(3.0 - math.log(math.exp(0) + math.exp(1) + math.exp(3) + math.exp(1)))
    assert contrastive_loss(q, d, q_offset=1).item() == pytest.approx(expect, rel=1e-6)
    with pytest.raises(ValueError, match="cannot hold"):
        contrastive_loss(q, d, q_offset=2)


def test_grad_cache_equals_plain_loss():
    torch.manual_seed(0)
    enc_q = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 4))
    enc_d = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 4))
    xq, xd = torch.randn(8, 6), torch.randn(16, 6)

    def grads():
        return [p.grad.clone() for p in [*enc_q.parameters(), *enc_d.parameters()]]

    torch.manual_seed(1)
    rng = torch.get_rng_state()
    plain = contrastive_loss(enc_q(xq), enc_d(xd))
    plain.backward()
    g_plain = grads()
    for p in [*enc_q.parameters(), *enc_d.parameters()]:
        p.grad = None
    torch.set_rng_state(rng)  # same dropout masks as the plain pass (query chunks first, then docs)
    cached = grad_cache_backward(
        lambda b: enc_q(b["x"]),
        lambda b: enc_d(b["x"]),
        [{"x": xq[i : i + 3]} for i in range(0, 8, 3)],
        [{"x": xd[i : i + 5]} for i in range(0, 16, 5)],
        contrastive_loss,
    )
    assert cached.item() == pytest.approx(plain.item(), rel=1e-5)
    for a, b in zip(g_plain, grads()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
