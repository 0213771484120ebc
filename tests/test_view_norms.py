"""The densification statistic's sums: the CPU kernel against float64 brute force and
torch's operations."""

import pytest
import torch

from splatscale.step.view_norms import add_view_norms_cpu, add_view_norms_torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_adds_each_view_norm_to_its_row(dtype):
    g = torch.Generator().manual_seed(0)
    count, seen = 20_000, 15_000
    rows = torch.randperm(count, generator=g)[:seen]  # each row at most once, unordered
    grads = torch.randn(seen, 2, generator=g, dtype=dtype) * 1e-4
    scale = torch.tensor([124.0, 93.0], dtype=dtype) * 2
    start = torch.rand(count, generator=g, dtype=dtype)
    results = {}
    for name, add in (("kernel", add_view_norms_cpu), ("torch", add_view_norms_torch)):
        sums, counts = start.clone(), torch.full((count,), 3.0, dtype=dtype)
        add(sums, counts, rows, grads, scale)
        results[name] = sums, counts
    norms = (grads.double() * scale.double()).square().sum(dim=1).sqrt()
    want = start.double().index_add(0, rows, norms)
    sums, counts = results["kernel"]
    torch.testing.assert_close(sums.double(), want, rtol=2 * torch.finfo(dtype).eps, atol=0)
    unseen = torch.ones(count, dtype=torch.bool)
    unseen[rows] = False
    assert torch.equal(sums[unseen], start[unseen])
    assert torch.equal(counts, torch.where(unseen, 3.0, 4.0).to(dtype))
    torch.testing.assert_close(sums, results["torch"][0], rtol=torch.finfo(dtype).eps, atol=0)
    assert torch.equal(counts, results["torch"][1])
