"""Collectives on tensors of any device, their buffers where the backend reads them.

NCCL moves device memory and gloo host memory: a tensor elsewhere is staged
through a copy on the backend's side and the result copied back. Ranks that
share one GPU train that way, over gloo; ranks on CPUs, and ranks each on a GPU
of their own over NCCL, stage nothing. The engines call these, never
``torch.distributed``'s own, so that their code is the same on every device.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

SUM, MAX = dist.ReduceOp.SUM, dist.ReduceOp.MAX


def buffer_device() -> torch.device:
    """Where the process group's backend reads and writes collective buffers: with
    NCCL the current CUDA device (each rank sets its own before joining)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _staged(tensor: Tensor, filled: bool = True) -> Tensor:
    """``tensor`` itself where the backend can use it in place, else a contiguous buffer
    there: a copy of it, or (not ``filled``) an empty one, for what is to be received."""
    device = buffer_device()
    if tensor.device == device and tensor.is_contiguous():
        return tensor
    if filled:
        return tensor.to(device).contiguous()
    return torch.empty(tensor.shape, dtype=tensor.dtype, device=device)


def _returned(staged: Tensor, tensor: Tensor) -> None:
    if staged is not tensor:
        tensor.copy_(staged)


def all_reduce(tensor: Tensor, op: dist.ReduceOp.RedOpType = SUM) -> None:
    """``tensor`` reduced over the ranks, in place."""
    staged = _staged(tensor)
    dist.all_reduce(staged, op=op)
    _returned(staged, tensor)


def all_to_all_single(output: Tensor, rows: Tensor, output_counts: list[int] | None = None,
                      input_counts: list[int] | None = None) -> None:
    """``torch.distributed.all_to_all_single``, into ``output``."""
    staged = _staged(output, filled=False)
    dist.all_to_all_single(staged, _staged(rows), output_counts, input_counts)
    _returned(staged, output)


def send(tensor: Tensor, destination: int) -> None:
    dist.send(_staged(tensor), destination)


def receive(tensor: Tensor, source: int) -> None:
    """Into ``tensor``, from rank ``source``."""
    staged = _staged(tensor, filled=False)
    dist.recv(staged, source)
    _returned(staged, tensor)
