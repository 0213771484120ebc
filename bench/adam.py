"""Host Adam throughput against this machine's memory bandwidth; prints one JSON line.

A float32 Adam step reads a parameter, its gradient and both moments and
writes the parameter and both moments: 28 bytes per parameter, so memory
bandwidth bounds it at ``bandwidth / 28`` parameters per second. Bandwidth is
measured here as torch's copy of a 1 GiB float32 tensor into another (bytes
read plus bytes written, per second; best of the repeats).

Measured, on 1M Gaussians (59 parameters each): the dense step of every row
(``adam_step``), and the offload engine's replay of 1 and of 15 steps for 40 %
of the rows in random order (``DeferredAdam.advance``, which also writes the
rows elsewhere); rates count parameter-steps per second.
"""

from __future__ import annotations

import argparse
import time

import numba
import torch

from splatscale.engine.offload.host_adam import DeferredAdam
from splatscale.model import GaussianModel
from splatscale.step.optimizer import GaussianAdam
from splatscale.step.row_set import RowSet

from report import emit

BYTES_PER_PARAMETER_STEP = 28
RATES = {"means": 1.6e-4, "sh0": 2.5e-3, "shN": 1.25e-4, "opacity_logits": 0.05,
         "log_scales": 5e-3, "quats": 1e-3}


def best_seconds(call, repeats: int) -> float:
    call()  # compiled, memory touched
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def bandwidth(repeats: int) -> float:
    source = torch.ones(2 ** 28)
    target = torch.empty_like(source)
    return 2 * source.nbytes / best_seconds(lambda: target.copy_(source), repeats)


def random_model(count: int) -> GaussianModel:
    generator = torch.Generator().manual_seed(0)
    shapes = {"means": (3,), "quats": (4,), "log_scales": (3,), "opacity_logits": (),
              "sh0": (1, 3), "shN": (15, 3)}
    return GaussianModel(**{n: torch.randn(count, *s, generator=generator)
                            for n, s in shapes.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gaussians", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = RowSet(random_model(args.gaussians))
    params = rows.params
    per_gaussian = sum(t[0].numel() for t in params.values())
    adam = GaussianAdam(params)
    gradients = {n: torch.randn_like(t) for n, t in params.items()}

    def dense_step() -> None:
        for name, tensor in params.items():  # the step clears them
            tensor.grad = gradients[name]
        adam.step(rows, RATES)
    dense = best_seconds(dense_step, args.repeats)

    deferred = DeferredAdam(adam, rows, args.gaussians)
    for _ in range(15):
        deferred.log_step(RATES, set(RATES))
    seen = torch.randperm(args.gaussians)[: int(0.4 * args.gaussians)].sort().values
    grads = {n: torch.randn(len(seen), *t.shape[1:]) for n, t in params.items()}
    rates = {}
    for skipped in (1, 15):
        deferred.updated_at.fill_(deferred.step_count - skipped)
        seconds = best_seconds(lambda: deferred.advance(seen, grads), args.repeats)
        rates[f"replay_{skipped}_parameter_steps_per_second"] = (
            len(seen) * per_gaussian * skipped / seconds)
    measured = bandwidth(args.repeats)
    emit({
        "gaussians": args.gaussians, "threads": numba.get_num_threads(),
        "memory_bandwidth_bytes_per_second": round(measured),
        "bandwidth_bound_parameters_per_second": round(measured / BYTES_PER_PARAMETER_STEP),
        "dense_parameters_per_second": round(args.gaussians * per_gaussian / dense),
        **{k: round(v) for k, v in rates.items()},
        "dense_fraction_of_bound": round(args.gaussians * per_gaussian / dense
                                         / (measured / BYTES_PER_PARAMETER_STEP), 3)})


if __name__ == "__main__":
    main()
