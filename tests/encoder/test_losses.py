import math

import pytest
import torch

from epr.encoder.losses import contrastive_loss, grad_cache_backward, group_loss, inbatch_contrastive


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


def _sp(x):  # softplus, by hand
    return math.log1p(math.exp(x))


def test_listwise_hand_computed():
    q = torch.tensor([[1.0]])
    d = torch.tensor([[1.0], [0.5], [2.0]])  # sims 1.0, 0.5, 2.0
    teacher = torch.tensor([[3.0, 1.0, 2.0]])  # ranks: cand0 1st, cand2 2nd, cand1 3rd
    valid = torch.ones(1, 3, dtype=torch.bool)
    # pairs (a above b) weighted by 1/r_a - 1/r_b, loss log(1 + exp(s_b - s_a))
    expect = 2 / 3 * _sp(0.5 - 1.0) + 1 / 2 * _sp(2.0 - 1.0) + 1 / 6 * _sp(0.5 - 2.0)
    got = group_loss("listwise", q, d, 3, teacher=teacher, valid=valid, weight=0.0)
    assert got.item() == pytest.approx(expect, rel=1e-6)
    # a padded (invalid) candidate takes no part: the same as the 2-candidate list without it
    valid2 = torch.tensor([[True, False, True]])
    expect2 = 1 / 2 * _sp(2.0 - 1.0)
    assert group_loss("listwise", q, d, 3, teacher=teacher, valid=valid2, weight=0.0).item() == pytest.approx(
        expect2, rel=1e-6
    )
    # + weight x in-batch contrastive with the teacher's best (cand0) as positive
    ce = -(1.0 - math.log(math.exp(1.0) + math.exp(0.5) + math.exp(2.0)))
    got_w = group_loss("listwise", q, d, 3, teacher=teacher, valid=valid, weight=0.5)
    assert got_w.item() == pytest.approx(expect + 0.5 * ce, rel=1e-6)


def test_distill_hand_computed():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    d = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 2.0], [0.0, 1.0]])
    teacher = torch.tensor([[0.0, math.log(3.0)], [1.0, 1.0]])
    valid = torch.ones(2, 2, dtype=torch.bool)
    # instance 0: p_t = (1/4, 3/4), p_s = softmax(0, 0) = (1/2, 1/2); instance 1: p_t = (1/2, 1/2), p_s = softmax(2, 1)
    kl0 = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    ps = [math.exp(2) / (math.exp(2) + math.e), math.e / (math.exp(2) + math.e)]
    kl1 = 0.5 * math.log(0.5 / ps[0]) + 0.5 * math.log(0.5 / ps[1])
    got = group_loss("distill", q, d, 2, teacher=teacher, valid=valid, weight=0.0)
    assert got.item() == pytest.approx((kl0 + kl1) / 2, rel=1e-6)
    # teacher temperature 2 flattens the target: (1, sqrt 3) / (1 + sqrt 3)
    p = [1 / (1 + math.sqrt(3)), math.sqrt(3) / (1 + math.sqrt(3))]
    kl0t = p[0] * math.log(p[0] / 0.5) + p[1] * math.log(p[1] / 0.5)
    got_t = group_loss("distill", q, d, 2, teacher=teacher, valid=valid, weight=0.0, teacher_temperature=2.0)
    assert got_t.item() == pytest.approx((kl0t + kl1) / 2, rel=1e-6)


def test_inbatch_masks_duplicates_of_the_positive():
    sim = torch.tensor([[2.0, 0.0, 1.0, 3.0]])
    ids = torch.tensor([7, 8, 9, 7])  # column 3 is the same pool example as the positive (column 0)
    expect = -(2.0 - math.log(math.exp(2.0) + math.exp(0.0) + math.exp(1.0)))
    assert inbatch_contrastive(sim, torch.tensor([0]), ids).item() == pytest.approx(expect, rel=1e-6)


def test_group_loss_epr_is_the_paper_loss():
    torch.manual_seed(0)
    q, d = torch.randn(4, 5), torch.randn(8, 5)
    assert group_loss("epr", q, d, 2, temperature=0.7).item() == pytest.approx(
        contrastive_loss(q, d, temperature=0.7).item(), rel=1e-6
    )
    with pytest.raises(ValueError, match="teacher"):
        group_loss("distill", q, d, 2)


@pytest.mark.parametrize("kind", ["epr", "listwise", "distill"])
def test_grad_cache_equals_plain_for_every_loss(kind):
    torch.manual_seed(0)
    enc_q = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    enc_d = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    G, B = 4, 6
    xq, xd = torch.randn(B, 6), torch.randn(G * B, 6)
    teacher = torch.randn(B, G)
    valid = torch.rand(B, G) > 0.2
    valid[:, 0] = True
    ids = torch.randint(0, 10, (G * B,))

    def loss_fn(q, d):
        return group_loss(kind, q, d, G, 0.5, teacher, valid, ids, weight=0.3, teacher_temperature=0.8)

    params = [*enc_q.parameters(), *enc_d.parameters()]
    plain = loss_fn(enc_q(xq), enc_d(xd))
    plain.backward()
    g_plain = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    cached = grad_cache_backward(
        lambda b: enc_q(b["x"]),
        lambda b: enc_d(b["x"]),
        [{"x": xq[i : i + 4]} for i in range(0, B, 4)],
        [{"x": xd[i : i + 7]} for i in range(0, G * B, 7)],
        loss_fn,
    )
    assert cached.item() == pytest.approx(plain.item(), rel=1e-5)
    for a, b in zip(g_plain, [p.grad for p in params]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
