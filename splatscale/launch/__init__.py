"""How the ranks of a run start and find each other, outside the engines.

- ``local_ranks``: ``--nproc N``'s launcher: N ranks on this machine, the signals
  and the exit status of the whole;
- ``group``: a rank's ``Membership`` (from torchrun's environment or the
  launcher's) and joining the process group;
- ``placement``: which device each rank takes, and which collective backend.
"""
