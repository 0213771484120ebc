"""Device memory of training on one device against offloaded; prints one JSON line.

For each scene (snowmiku's SfM points at B = 1 with its images; 1M Gaussians
from the garden splats with a garden camera; ``large``: that garden laid 3 x 2
times side by side, several million Gaussians of which the camera sees about
a tenth, as a view of a city-scale capture does), after a warm-up step, per
engine:

- ``*_device_bytes_per_gaussian``: what stays on the device between steps.
  Local: the parameters, their gradients, both Adam moments, keys and
  densification statistics. Offload: means, log-scales, quaternions and the
  step each row was written at.
- ``*_peak_bytes``: a step's peak on the device: the persistent bytes and
  the largest phase of the step (offload: every candidate's parameters and
  key, brought while the exact test runs; the visible rows taken from them;
  the visible rows rendered), each with the peak of what that phase
  allocates on the device, measured with torch's profiler
  (``profile_memory``: every allocation and free of the step's tensors,
  activations, saved tensors and gradients included). The CPU's own caches
  count as a device's allocator would see them: the gradients kept from step to
  step as held throughout, the packed splats from their allocation until their
  render is done with them (a CPU run also keeps them for the next render:
  ``render/buffer_pool.py``; ``growth.py``'s peak resident memory counts that).
  On a CPU the device is host memory, so the offload engine's host-side work (the culling bound, the
  forwarded values, the host Adam) is left out of its device count: those
  tensors live in host memory on a GPU machine. ``offload_peak_bytes_looking_ahead``
  adds what lookahead (on by default on a GPU) keeps beside the backward pass:
  the next step's rows sent early: at most its candidates, taken here as many
  as this step's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from splatscale.engine import TrainView
from splatscale.engine.factory import OffloadOptions, make_engine
from splatscale.engine.rows import WorkingSet
from splatscale.model.gaussians import GaussianModel
from splatscale.render.buffer_pool import BufferPool
from splatscale.render.projection import visibility
from splatscale.strategy.default import GradientNorms

from report import emit
from scenes import garden_scene, snowmiku_init, tiled_garden

def rates(extent: float = 1.0) -> dict[str, float]:
    """3DGS's initial learning rates."""
    return {"means": 1.6e-4 * extent, "sh0": 2.5e-3, "shN": 2.5e-3 / 20,
            "opacity_logits": 0.05, "log_scales": 5e-3, "quats": 1e-3}


def allocated_peak(step) -> int:
    """The largest number of bytes ``step()`` has allocated and not yet freed."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return max([0, *totals])


class Taken:
    """Rows whose working set is ``working`` as it is (the compute part's render,
    loss and backward pass over it, alone)."""

    def __init__(self, working: WorkingSet) -> None:
        self.working = working

    def working_set(self, cameras) -> WorkingSet:
        return self.working

    def gradients_taken(self, working: WorkingSet) -> None:
        """The gradients stay on the working set's tensors."""

    def spare_gradients(self) -> list:
        """None: each backward allocates its gradients, as the offloaded rows' does."""
        return []


def local_memory(model: GaussianModel, views: list[TrainView]) -> dict[str, float]:
    engine = make_engine(model.detach(), len(views), torch.zeros(3))
    engine.forward_backward(views, GradientNorms())
    engine.optimizer_step(rates())
    # The parameters, keys, both Adam moments and the densification statistics.
    kept = sum(t.nbytes for t in engine.row_set.tensors().values())
    # Kept after each step's Adam for the next backward (on the CPU), else allocated by
    # the step and counted in its peak.
    gradients = sum(t.nbytes for t in engine.model.parameters().values())
    spares = sum(t.nbytes for t in engine.rows.spares)

    def step() -> None:
        engine.forward_backward(views, GradientNorms())
        engine.optimizer_step(rates())
    return {"device_bytes_per_gaussian": (kept + gradients) / len(model),
            "peak_bytes": kept + spares + allocated_peak(step)}


def offload_memory(model: GaussianModel, views: list[TrainView]) -> dict[str, float]:
    engine = make_engine(model.detach(), len(views), torch.zeros(3),
                         offload=OffloadOptions(forwarding=False))
    engine.forward_backward(views, GradientNorms())
    engine.optimizer_step(rates())
    cameras = [view.camera for view in views]
    # The step's device part, piece by piece (the engine's own calls).
    working = engine.rows.working_set(cameras)
    candidates = engine.rows.candidates(cameras)
    tested = GaussianModel(**engine.rows.current(candidates), sh_degree=0)
    test_peak = allocated_peak(lambda: visibility(tested, cameras))
    render_peak = allocated_peak(lambda: engine.compute.forward_backward(Taken(working), views,
                                                                         None))
    row_bytes = sum(t[0].nbytes for t in working.model.parameters().values()) + 8  # and key
    sent, kept = len(candidates) * row_bytes, len(working.rows) * row_bytes
    # Every candidate's values arrive while the exact test runs, the visible rows are
    # taken from them, then rendered. Looking ahead, the next step's rows that this
    # one does not see wait beside its backward pass: at most the next candidates,
    # taken here as many as this step's.
    phases = {"test": sent + test_peak, "gather": sent + kept, "render": kept + render_peak}
    step_bytes = max(phases.values())
    ahead_bytes = max(step_bytes, phases["render"] + sent)
    persistent = engine.rows.memory_per_gaussian()["device"]
    return {"device_bytes_per_gaussian": persistent,
            "peak_bytes": persistent * len(model) + step_bytes,
            "peak_bytes_looking_ahead": persistent * len(model) + ahead_bytes,
            "step_bytes_per_visible": step_bytes / len(working.rows),
            "visible_fraction": len(working.rows) / len(model),
            "candidate_fraction": len(candidates) / len(model)}


def scenes(gaussians: int, large_gaussians: int):
    store, model = snowmiku_init()
    yield "snowmiku", model, [TrainView(store.camera(0), store.as_float(0))]
    for name, make in (("garden", lambda: garden_scene(gaussians)),
                       ("large", lambda: tiled_garden(large_gaussians // 6, 3, 2))):
        model, cameras = make()
        camera = cameras[0]
        yield name, model, [TrainView(camera, torch.zeros(camera.height, camera.width, 3))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gaussians", type=int, default=1_000_000, help="of the garden scene")
    parser.add_argument("--large-gaussians", type=int, default=4_500_000,
                        help="of the large scene")
    args = parser.parse_args()
    # A device's allocator reuses what a render frees: the packed splats are counted from
    # their allocation to their render's giving them back, not kept between renders.
    importlib.import_module("splatscale.render.rasterize").INTERSECTION_ROWS = BufferPool(
        kept=0, headroom=1.0)
    out = {}
    for name, model, views in scenes(args.gaussians, args.large_gaussians):
        local, offload = local_memory(model, views), offload_memory(model, views)
        out[name] = {"gaussians": len(model),
                     "local_device_bytes_per_gaussian": local["device_bytes_per_gaussian"],
                     "offload_device_bytes_per_gaussian": offload["device_bytes_per_gaussian"],
                     "local_peak_bytes": local["peak_bytes"],
                     "offload_peak_bytes": offload["peak_bytes"],
                     "offload_peak_bytes_looking_ahead": offload["peak_bytes_looking_ahead"],
                     "peak_ratio": round(local["peak_bytes"] / offload["peak_bytes"], 2),
                     "peak_ratio_looking_ahead": round(
                         local["peak_bytes"] / offload["peak_bytes_looking_ahead"], 2),
                     "offload_step_bytes_per_visible": round(offload["step_bytes_per_visible"]),
                     "visible_fraction": round(offload["visible_fraction"], 3),
                     "candidate_fraction": round(offload["candidate_fraction"], 3)}
    emit(out)


if __name__ == "__main__":
    main()
