"""One backend per device type: the registry, and each backend's device functions
against the cpu backend's (the cuda backend's torch operations run on CPU tensors
too; its memory, streams and clock only on a GPU)."""

from __future__ import annotations

import math

import pytest
import torch

from splatscale.backends import BACKENDS, Backend, backend_for, backend_named
from splatscale.engine.offload.transfers import Transfers

CPU, CUDA = backend_named("cpu"), backend_named("cuda")


@pytest.mark.parametrize("device, name", [("cpu", "cpu"), (torch.device("cpu"), "cpu"),
                                          ("cuda", "cuda"), ("cuda:1", "cuda"),
                                          (torch.device("cuda", 0), "cuda")])
def test_a_device_has_the_backend_of_its_type(device, name):
    backend = backend_for(device)
    assert isinstance(backend, Backend) and backend.name == name
    assert backend is backend_named(name)  # one object per device type


@pytest.mark.parametrize("device", ["meta", "mps", torch.device("meta")])
def test_a_device_without_a_backend_is_refused_naming_those_there_are(device):
    with pytest.raises(ValueError, match="no backend for device .*: the backends are cpu, cuda"):
        backend_for(device)


def test_an_unknown_name_is_refused_naming_the_backends():
    with pytest.raises(ValueError, match="no backend named 'rocm': the backends are cpu, cuda"):
        backend_named("rocm")


def test_every_registered_backend_is_named_as_registered():
    assert [backend_named(name).name for name in BACKENDS] == list(BACKENDS)


def images(seed: int, dtype=torch.float64, shape=(23, 31, 3)):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(shape, generator=g, dtype=dtype) * 1.2 - 0.1  # some outside [0, 1]
    b = torch.rand(shape, generator=g, dtype=dtype)
    b[::4] = a[::4]  # equal values: a zero L1 gradient
    return a, b


def test_the_loss_parts_agree():
    a, b = images(0)
    a.requires_grad_(True)
    sums = [backend.abs_difference_sum(a, b) for backend in (CPU, CUDA)]
    torch.testing.assert_close(sums[0], sums[1], rtol=1e-12, atol=0)
    grads = [torch.autograd.grad(s, a)[0] for s in sums]
    assert torch.equal(grads[0], grads[1])
    errors = [backend.squared_error_sum(a.detach(), b) for backend in (CPU, CUDA)]
    assert math.isclose(errors[0], errors[1], rel_tol=1e-12)
    for rows, count in (((0, 23), 23 * 31 * 3), ((4, 17), 5000)):
        values = [backend.ssim(a, b, rows, count) for backend in (CPU, CUDA)]
        torch.testing.assert_close(values[0], values[1], rtol=1e-12, atol=0)
        grads = [torch.autograd.grad(v, a)[0] for v in values]
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adam_steps_agree(dtype):
    """One in-place step of flat tensors, the numba kernel against torch's operations,
    and both against torch.optim.Adam's formula written out."""
    g = torch.Generator().manual_seed(1)
    param, m, grad = (torch.randn(1000, generator=g, dtype=torch.float64) for _ in range(3))
    v = torch.rand(1000, generator=g, dtype=torch.float64)
    lr, beta1, beta2, eps, t = 1e-2, 0.9, 0.999, 1e-8, 3
    scale, root_bias2 = -lr / (1 - beta1 ** t), math.sqrt(1 - beta2 ** t)
    m_want = beta1 * m + (1 - beta1) * grad
    v_want = beta2 * v + (1 - beta2) * grad * grad
    want = param + scale * m_want / (v_want.sqrt() / root_bias2 + eps)
    for backend in (CPU, CUDA):
        state = [x.to(dtype, copy=True) for x in (param, m, v)]
        backend.adam_step(*state, grad.to(dtype), scale, root_bias2, beta1, beta2, eps)
        tolerance = 1e-5 if dtype == torch.float32 else 1e-12
        for got, expected in zip(state, (want, m_want, v_want)):
            torch.testing.assert_close(got, expected.to(dtype), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pixels_become_the_same_floats(dtype):
    pixels = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    assert torch.equal(CUDA.pixels_as_float(pixels, dtype), CPU.pixels_as_float(pixels, dtype))
    assert torch.equal(CPU.pixels_as_float(pixels, dtype), pixels.to(dtype) / 255)


def test_the_cpu_is_host_memory_without_queues():
    assert CPU.shares_host_memory and CPU.streams is None
    assert not CUDA.shares_host_memory and CUDA.streams is not None
    assert 0 < CPU.free_memory(torch.device("cpu"))
    CPU.synchronize(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_backends_memory_streams_and_clock():
    device = torch.device("cuda")
    free, total = torch.cuda.mem_get_info(device)
    assert 0 < CUDA.free_memory(device) <= total
    streams = CUDA.streams
    assert streams is not None
    copies = streams.new(device)
    start, end = streams.event(True), streams.event(True)
    with streams.using(copies):
        start.record()
        torch.cuda._sleep(10 ** 6)
        end.record()
    streams.current(device).wait_event(end)
    CUDA.synchronize(device)
    assert start.elapsed_time(end) > 0


def test_transfers_on_the_cpu_move_nothing():
    transfers = Transfers(torch.device("cpu"))
    tensor = torch.arange(10)
    assert transfers.upload(tensor) is tensor
    assert not transfers.staging((2,), torch.float32).is_pinned()
    assert transfers.seconds() == {"host_to_device": 0.0, "device_to_host": 0.0, "waited": 0.0}
