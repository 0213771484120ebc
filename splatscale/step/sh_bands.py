"""The SH bands a training run holds: those of the degree in use, not all four.

3DGS raises the SH degree as it trains (one band more every thousand images), and
until a band is in use its coefficients and their Adam moments stay zero: no
gradient reaches them, and Adam leaves zero moments and a zero gradient as they
are. Holding them costs all the same: ``shN``'s rows are 45 values wide, so every
pass over them (the colours, their gradient, Adam's four streams) reads and writes
five times what degree 1 uses. So a row set holds ``shN`` only up to the degree in
use, and takes a band's zero columns on when the degree reaches it: the same
numbers, bit for bit, as holding them all along.
"""

from __future__ import annotations

import torch
from torch import Tensor

from splatscale.model.gaussians import sh_rest
from splatscale.step.row_set import MOMENTS, RowSet
from splatscale.step.selection import Total


def hold_sh_bands(row_set: RowSet, degree: int, total: Total) -> None:
    """``row_set``'s ``shN`` and its moments hold the coefficients of ``degree``, and no
    more where the others and their moments are zero on every rank (where any is not,
    as in a model read at a higher degree, they stay). An edit of values
    (``Engine.edit_rows``'): every rank calls it, with ``total`` its sum over them."""
    wanted, param = sh_rest(degree), row_set.params["shN"].detach()
    held = param.shape[1]
    tensors = [param, *(row_set.moments[kind]["shN"] for kind in MOMENTS)]
    if held > wanted and total(int(any(bool(t[:, wanted:].any()) for t in tensors))) > 0:
        return
    if held != wanted:
        row_set.map_values(["shN"], lambda _, t: _held(t, wanted), lambda _, t: _held(t, wanted))


def _held(tensor: Tensor, wanted: int) -> Tensor:
    """``tensor``'s first ``wanted`` coefficients, those it lacks zero; a new tensor."""
    if tensor.shape[1] >= wanted:
        return tensor[:, :wanted].clone(memory_format=torch.contiguous_format)
    missing = tensor.new_zeros((tensor.shape[0], wanted - tensor.shape[1], *tensor.shape[2:]))
    return torch.cat([tensor, missing], dim=1)
