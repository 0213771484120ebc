"""The row set: every per-Gaussian tensor of an engine, in one row order, edited together.

A ``RowSet`` holds the Gaussians of an engine (all of them, or a rank's shard):
the model's parameters and keys, each parameter's two Adam moments, and the
strategy's per-row state (an open collection: ``state[name]`` is a tensor of one
row per Gaussian, such as 3DGS's densification statistics). Every change of the
rows goes through one of its three edits, so nothing can fall out of step:

- ``replace(keep, added)``: keep some rows, then append new ones (their moments
  and state start at zero): densification, pruning, relocation;
- ``map_values(names, param, moment)``: new values for the rows of some
  parameter groups, same rows: the opacity reset, MCMC's noise;
- ``map_rows(move)``: every per-row tensor through one function, in a fixed
  order: moves between ranks and devices.

``tensors()`` names every per-row tensor, in that same order, for checkpoints,
shards and gathers. A parameter group whose tensor an edit replaced is
``edited``: the gradient taken before belonged to the old tensor, so Adam skips
that group once (``take_edited``).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor

from splatscale.model.gaussians import GaussianModel

MOMENTS = ("exp_avg", "exp_avg_sq")


class RowSet:
    def __init__(self, model: GaussianModel, moments: dict[str, dict[str, Tensor]] | None = None,
                 state: dict[str, Tensor] | None = None, events: int = 0) -> None:
        """``model``'s tensors are taken as they are (made leaves that require grad);
        ``moments`` None: zero. ``events`` counts the row edits that seed new keys."""
        self.model = model.requires_grad_(True)
        self.moments = moments if moments is not None else {
            kind: {n: torch.zeros_like(p.detach()) for n, p in model.parameters().items()}
            for kind in MOMENTS}
        self.state = state if state is not None else {}
        self.events = events  # event numbers handed out (``next_event``)
        self.edited: set[str] = set()
        self.replaced = False  # rows added, removed or moved since ``take_replaced``

    def __len__(self) -> int:
        return len(self.model)

    @property
    def params(self) -> dict[str, Tensor]:
        return self.model.parameters()

    def state_zeros(self, name: str, dtype: torch.dtype | None = None) -> Tensor:
        """``state[name]``, made zero (of one row per Gaussian) when absent."""
        if name not in self.state:
            means = self.model.means
            self.state[name] = torch.zeros(len(self), dtype=dtype or means.dtype,
                                           device=means.device)
        return self.state[name]

    def zero_state(self) -> None:
        """Every per-row state tensor back to zero (a statistic that starts again)."""
        self.state = {name: torch.zeros_like(t) for name, t in self.state.items()}

    def next_event(self) -> int:
        """A number no earlier edit used, the same on every rank (edits are collective)."""
        self.events += 1
        return self.events - 1

    # -- the edits ---------------------------------------------------------------------

    def replace(self, keep: Tensor, added: dict[str, Tensor] | None = None) -> None:
        """Keep rows ``keep`` (index or mask) of every per-row tensor, then append
        ``added``: a row of each parameter and ``keys``; their moments and state zero."""
        if keep.dtype == torch.bool and len(keep) != len(self):
            raise ValueError(f"a keep mask of {len(keep)} rows for {len(self)} Gaussians")
        # index_select, not indexing: the same rows, copied in parallel.
        index = keep.nonzero()[:, 0] if keep.dtype == torch.bool else keep

        def rows(tensor: Tensor, new: Tensor | None) -> Tensor:
            kept = tensor.index_select(0, index.to(tensor.device))
            return kept if new is None else torch.cat([kept, new.to(kept.dtype)])

        def zeros(like: Tensor) -> Tensor | None:
            if added is None:
                return None
            return torch.zeros((len(added["keys"]), *like.shape[1:]), dtype=like.dtype,
                               device=like.device)

        with torch.no_grad():
            params = {n: rows(p.detach(), None if added is None else added[n])
                      for n, p in self.params.items()}
        for kind in MOMENTS:
            self.moments[kind] = {n: rows(m, zeros(m)) for n, m in self.moments[kind].items()}
        self.state = {n: rows(s, zeros(s)) for n, s in self.state.items()}
        keys = self.model.keys
        self.model.keys = rows(keys, None if added is None else added["keys"])
        self._take_params(params, replaced=True)

    def map_values(self, names: Iterable[str], param: Callable[[str, Tensor], Tensor],
                   moment: Callable[[str, Tensor], Tensor]) -> None:
        """Groups ``names``: each parameter ``p`` becomes ``param(name, p)`` (detached)
        and each of its moments ``m`` becomes ``moment(name, m)``; same rows (a row may
        change its width, its moments' with it: SH's bands, ``step/sh_bands.py``)."""
        names = list(names)
        with torch.no_grad():
            params = {n: param(n, self.params[n].detach()) for n in names}
        for kind in MOMENTS:
            for name in names:
                self.moments[kind][name] = moment(name, self.moments[kind][name])
        self._take_params(params, replaced=False)

    def map_rows(self, move: Callable[[str, Tensor], Tensor]) -> None:
        """Every per-row tensor ``t`` of ``tensors()``' name ``n`` becomes ``move(n, t)``,
        in ``tensors()``' order (collective moves rely on it)."""
        moved = {name: move(name, tensor.detach()) for name, tensor in self.tensors().items()}
        self.model.keys = moved.pop("keys")
        for kind in MOMENTS:
            self.moments[kind] = {n: moved.pop(f"{kind}/{n}") for n in self.moments[kind]}
        self.state = {n: moved.pop(f"state/{n}") for n in list(self.state)}
        self._take_params(moved, replaced=True)

    def _take_params(self, params: dict[str, Tensor], replaced: bool) -> None:
        self.model.set_parameters({n: t.requires_grad_(True) for n, t in params.items()})
        self.edited.update(params)
        self.replaced |= replaced

    # -- reading -----------------------------------------------------------------------

    def tensors(self) -> dict[str, Tensor]:
        """Every per-row tensor by name: the parameters, ``keys``, ``exp_avg/<group>``,
        ``exp_avg_sq/<group>`` and ``state/<name>``, in a fixed order."""
        named = dict(self.params)
        named["keys"] = self.model.keys
        for kind in MOMENTS:
            named.update({f"{kind}/{n}": m for n, m in self.moments[kind].items()})
        named.update({f"state/{n}": s for n, s in self.state.items()})
        return named

    def take_edited(self) -> set[str]:
        """The groups edited since the last call (whose gradient is stale); forgotten."""
        edited, self.edited = self.edited, set()
        return edited

    def take_replaced(self) -> bool:
        """Whether rows were added, removed or moved since the last call; forgotten."""
        replaced, self.replaced = self.replaced, False
        return replaced
