"""Copies between host memory and the device, counted and, on request, timed.

On a GPU, values go up from page-locked (pinned) copies without blocking the
host, which goes on gathering the rest while the copy engine works, in the
order of the device's stream, so the step that reads them finds them there.
Gradients come down into pinned memory, every copy queued before one wait.
On the CPU the device is host memory: nothing moves.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterator

import torch
from torch import Tensor

DIRECTIONS = ("host_to_device", "device_to_host")


class Transfers:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on_gpu = device.type == "cuda"
        self.timed = False  # on a GPU: keep each copy's time on the stream, for ``seconds``
        self.bytes = dict.fromkeys(DIRECTIONS, 0)
        self._events: dict[str, list] = {direction: [] for direction in DIRECTIONS}

    def upload(self, tensor: Tensor) -> Tensor:
        """``tensor`` (in host memory) on the device."""
        self.bytes["host_to_device"] += tensor.nbytes
        if not self.on_gpu:
            return tensor.to(self.device)
        pinned = tensor.pin_memory()  # a host copy: timed apart from the device's
        with self._timing("host_to_device"):
            return pinned.to(self.device, non_blocking=True)

    def download(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """Each of ``tensors`` in host memory, its copy complete."""
        self.bytes["device_to_host"] += sum(t.nbytes for t in tensors.values())
        if not self.on_gpu:
            return {name: t.cpu() for name, t in tensors.items()}
        host = {name: torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                for name, t in tensors.items()}
        with self._timing("device_to_host"):
            for name, t in tensors.items():
                host[name].copy_(t, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return host

    def seconds(self) -> dict[str, float]:
        """Each direction's copy time so far on the device (0 unless ``timed``)."""
        if self.on_gpu:
            torch.cuda.synchronize(self.device)
        return {direction: sum(start.elapsed_time(end) for start, end in pairs) / 1e3
                for direction, pairs in self._events.items()}

    def _timing(self, direction: str):
        return _timed(self._events[direction]) if self.timed and self.on_gpu else nullcontext()


@contextmanager
def _timed(pairs: list) -> Iterator[None]:
    """Events on the device's stream either side of the copies queued inside."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    yield
    end.record()
    pairs.append((start, end))
