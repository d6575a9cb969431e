"""benchmarks.training's operator count: every aten operator a step dispatches, its backward's included (the
launch count a GPU pays), the same however it is timed."""

import contextlib

import torch

from benchmarks.training import count_ops


def test_count_ops_counts_forward_and_backward_operators():
    def fwd():
        x = torch.ones(3, requires_grad=True)
        return (x * 2).sum()

    n_fwd = count_ops(fwd, contextlib.nullcontext)
    n_both = count_ops(lambda: fwd().backward(), contextlib.nullcontext)
    assert n_fwd >= 3  # ones, mul, sum
    assert n_both > n_fwd  # the backward's operators are counted too
    assert count_ops(fwd, contextlib.nullcontext) == n_fwd  # a count, not a timing: the same each call
