"""Copies between host memory and the device, counted and, on request, timed.

On a device with queues of its own (a GPU: its backend's ``streams``), values go
up on a stream of the copies' own, from page-locked (pinned) host memory,
without blocking the host: ``send`` returns copies in flight, and the device's
compute stream waits for them only where it first reads them
(``InFlight.ready``), so that they overlap whatever the device computes
meanwhile. Values the host computes in order to send them are written straight
into pinned buffers (``staging``). Gradients come down into pinned memory,
queued behind the backward pass, every copy before one wait (``Landing.ready``).
On the CPU the device is host memory: nothing moves.

Copies made on the copy stream live in the caching allocator's pool for that
stream, beside the compute stream's: device memory reserved grows by the
largest working set sent, not by what is allocated. Allocating them on the
compute stream instead would order every copy behind the compute queued
before it, and a step's early sends could no longer overlap its backward pass.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from splatscale.backends import Streams, backend_for

DIRECTIONS = ("host_to_device", "device_to_host")


class InFlight:
    """Tensors on their way to the device."""

    def __init__(self, tensors: dict[str, Tensor],
                 arrive: Callable[[], Any] | None = None) -> None:
        self._tensors = tensors
        # Makes the current stream wait for the copies, and returns it; None: already there.
        self._arrive = arrive

    def ready(self) -> dict[str, Tensor]:
        """The copies, safe to read from the current stream from here on."""
        if self._arrive is not None:
            stream = self._arrive()
            for tensor in self._tensors.values():  # made on the copy stream, used here
                tensor.record_stream(stream)
            self._arrive = None
        return self._tensors


class Landing:
    """Tensors on their way to host memory."""

    def __init__(self, tensors: dict[str, Tensor], done: Any = None) -> None:
        self._tensors = tensors
        self._done = done  # an event after the copies; None: already there

    def ready(self) -> dict[str, Tensor]:
        """The copies, complete: the host waits for them here."""
        if self._done is not None:
            self._done.synchronize()
            self._done = None
        return self._tensors


class Transfers:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.backend = backend_for(device)
        self.streams = self.backend.streams  # None: the device is host memory
        self.stream = self.streams.new(device) if self.streams is not None else None
        self.timed = False  # on a GPU: keep each copy's time on the stream, for ``seconds``
        self.bytes = dict.fromkeys(DIRECTIONS, 0)
        self._events: dict[str, list] = {kind: [] for kind in (*DIRECTIONS, "waited")}

    def staging(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """An empty host tensor to fill and then send: pinned where copies run behind
        the host, so that its copy needs no pinned copy of its own."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.streams is not None)

    def send(self, tensors: dict[str, Tensor]) -> InFlight:
        """Each of ``tensors`` (in host memory) copied to the device, in flight."""
        self.bytes["host_to_device"] += sum(t.nbytes for t in tensors.values())
        streams = self.streams
        if streams is None:
            return InFlight({name: t.to(self.device) for name, t in tensors.items()})
        pinned = {name: t if t.is_pinned() else t.pin_memory() for name, t in tensors.items()}
        with streams.using(self.stream), self._timing("host_to_device"):
            copies = {name: t.to(self.device, non_blocking=True) for name, t in pinned.items()}
            done = streams.event(False)
            done.record(self.stream)
        waits = self._events["waited"] if self.timed else None  # the compute stream's waits

        def arrive() -> Any:
            stream = streams.current(self.device)
            with _timed(streams, waits) if waits is not None else nullcontext():
                stream.wait_event(done)
            return stream
        return InFlight(copies, arrive)

    def upload(self, tensor: Tensor) -> Tensor:
        """``tensor`` (in host memory) on the device, ready for the current stream."""
        return self.send({"tensor": tensor}).ready()["tensor"]

    def download(self, tensors: dict[str, Tensor]) -> Landing:
        """Each of ``tensors`` copied to host memory, queued on the current stream
        behind whatever computes them; the host goes on until ``ready``."""
        self.bytes["device_to_host"] += sum(t.nbytes for t in tensors.values())
        if self.streams is None:
            return Landing({name: t.cpu() for name, t in tensors.items()})
        host = {name: torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                for name, t in tensors.items()}
        with self._timing("device_to_host"):
            for name, t in tensors.items():
                host[name].copy_(t, non_blocking=True)
        done = self.streams.event(False)
        done.record(self.streams.current(self.device))
        return Landing(host, done)

    def seconds(self) -> dict[str, float]:
        """Each direction's copy time so far on the device, and ``waited``: how long
        the compute stream waited for copies up, the part of them not hidden behind
        its work (each 0 unless ``timed``)."""
        self.backend.synchronize(self.device)
        return {kind: sum(start.elapsed_time(end) for start, end in pairs) / 1e3
                for kind, pairs in self._events.items()}

    def _timing(self, direction: str):
        if self.timed and self.streams is not None:
            return _timed(self.streams, self._events[direction])
        return nullcontext()


@contextmanager
def _timed(streams: Streams, pairs: list) -> Iterator[None]:
    """Events on the current stream either side of the work queued inside."""
    start, end = streams.event(True), streams.event(True)
    start.record()
    yield
    end.record()
    pairs.append((start, end))
