"""The math of one training step, shared by every engine and strategy.

- ``row_set``: every per-Gaussian tensor of an engine in one order, and its edits;
- ``observer``: what a step saw (``Seen``), told to an ``Observer``;
- ``loss``: the 3DGS photometric loss and PSNR; ``ssim``: SSIM; ``view_loss``: the
  loss of a view or of a band of its rows, the one path every engine takes;
- ``optimizer``: Adam over the Gaussian parameters with the batch-size rule, its
  arithmetic in ``adam_kernels``;
- ``selection``: the k first rows of all ranks, without gathering them;
- ``keyed_random``: random numbers that are hashes of a Gaussian's key;
- ``schedule``: events and the learning rate, counted in images seen.

This package sits between ``render`` and ``strategy``: it imports the model, the
renderer's geometry helpers and the backends' contract, never a strategy, an
engine or the Trainer.
"""
