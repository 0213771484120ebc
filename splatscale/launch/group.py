"""The process group: joined from torchrun's environment, or made by spawning local ranks.

torchrun (and Slurm through it) sets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ``--nproc``'s launcher
(``splatscale.launch``) sets the same for N processes on this machine, so both
paths join the group the same way. They are input, checked as any flag is. The
backend is gloo, or NCCL for ranks each on a GPU of its own (``placement``).
Collectives time out, so a rank that dies makes the others stop rather than hang:
over gloo with an error each reports in one line; over NCCL its watchdog ends
the process, in its own words.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, NoReturn, Protocol, TypeVar

import torch
import torch.distributed as dist

from splatscale.engine.distributed import collectives
from splatscale.launch.placement import Placement, chosen_backend, gpu_identity
from splatscale.errors import SplatscaleError, StoppedByPeer
from splatscale.threads import usable_cores

TIMEOUT = timedelta(seconds=60)  # of one collective: a rank that stops answering
JOIN_TIMEOUT = 120.0             # seconds for every rank to arrive, by default
POLL = 0.5                       # seconds between the ranks' checks of work under way
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class JoinError(SplatscaleError):
    """The ranks did not all arrive: every rank that waited meets it, so rank 0 says
    it, unless rank 0 is one of those missing."""

    voice = "rank 0"


class UnreachableError(SplatscaleError):
    """Rank 0 cannot be reached: each rank that tried says so."""


@dataclass(frozen=True)
class Membership:
    """This process' place in the group, and where rank 0 listens."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    address: str = "127.0.0.1"
    port: int = 29500


def from_environment() -> Membership | None:
    """This process' place in a group started by torchrun or ``--nproc``'s launcher;
    None alone. A variable that is missing or wrong is refused, naming it."""
    if "WORLD_SIZE" not in os.environ:
        if "RANK" in os.environ:
            raise SplatscaleError(f"environment variable RANK={os.environ['RANK']!r} is set, "
                                  "but WORLD_SIZE is not: set both (torchrun does), or "
                                  "neither to train alone")
        return None
    world = _variable("WORLD_SIZE", 1)
    if world == 1:
        return None
    rank = _variable("RANK", 0, world - 1, world)
    local_world = _variable("LOCAL_WORLD_SIZE", 1, world, world, default=world)
    local_rank = _variable("LOCAL_RANK", 0, local_world - 1, world, default=rank % local_world)
    address = os.environ.get("MASTER_ADDR", "").strip()
    if not address:
        raise LaunchError("MASTER_ADDR", _unset("MASTER_ADDR", world))
    return Membership(rank, world, local_rank, local_world, address,
                 _variable("MASTER_PORT", 1, 65535, world))


def _variable(name: str, low: int, high: int | None = None, world: int | None = None,
              default: int | None = None) -> int:
    text = os.environ.get(name)
    if text is None or not text.strip():
        if default is not None:
            return default
        raise LaunchError(name, _unset(name, world))
    try:
        value = int(text)
    except ValueError:
        raise LaunchError(name, f"environment variable {name}={text!r}: not an integer") from None
    if value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise LaunchError(name, f"environment variable {name}={value}: must be {bounds}")
    return value


class LaunchError(SplatscaleError):
    """A launcher's variable that is missing or wrong. Those a launcher gives every
    rank alike are said by rank 0 (``messages.rank`` reads RANK and WORLD_SIZE, so
    they must be sound for that); RANK's own, by each rank."""

    SHARED = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.voice = "rank 0" if name in self.SHARED else "self"


def _unset(name: str, world: int | None) -> str:
    return (f"environment variable {name} is not set, but WORLD_SIZE={world} is: each of "
            "the ranks needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun sets "
            "them; or train with --nproc N on one machine)")


CONNECT_ATTEMPT = 1.0  # seconds one connection attempt to rank 0's store may block


def join(ranks: Membership, timeout: float = JOIN_TIMEOUT, device: str = "cpu",
         comm: str | None = None) -> Placement:
    """Meet every rank at MASTER_ADDR:MASTER_PORT within ``timeout`` seconds, this one
    computing on ``device``, then form the group over the backend they all choose
    (``placement``, ``comm`` if it can work); a rank that does not arrive is reported
    as a count, not a traceback. If another rank's own checks refused the run
    (``refuse``), this one stops without a word."""
    if dist.is_initialized():
        return Placement(device, str(dist.get_backend()), shared=False)
    store, refused = _meet(ranks, timeout, gpu_identity(device), refused=False)
    if any(refused):
        raise StoppedByPeer()  # another rank's checks refused the run: it says why
    gpus = {store.get(f"gpu{rank}") for rank in range(ranks.world)}
    shared = device != "cpu" and len(gpus) < ranks.world
    backend = chosen_backend(device, shared, comm)
    store.set_timeout(TIMEOUT)
    dist.init_process_group(backend, store=store, rank=ranks.rank, world_size=ranks.world,
                            timeout=TIMEOUT)
    return Placement(device, backend, shared)


def refuse(ranks: Membership, refusal: SplatscaleError, timeout: float = JOIN_TIMEOUT) -> NoReturn:
    """Stop the group before it forms, because this rank's checks refused the run:
    meet the others as ``join`` does, then ``agreed``'s rule says who speaks, once."""
    try:
        _, refused = _meet(ranks, timeout, "", refused=True)
    except SplatscaleError:  # the others may never hear of it: say it here
        refusal.voice = "self"
        raise refusal from None
    raise _failure_to_raise(refused, refusal, ranks.rank)


def _meet(ranks: Membership, timeout: float, gpu: str,
          refused: bool) -> tuple[dist.Store, list[bool]]:
    """Every rank arrived at the store, each having published its GPU and whether its
    own checks refused the run; the store and every rank's refusal."""
    store = _store(ranks, timeout)
    store.set(f"rank{ranks.rank}", "joined")
    store.set(f"gpu{ranks.rank}", gpu)
    store.set(f"refused{ranks.rank}", "1" if refused else "0")
    store.add("joined", 1)
    deadline = time.monotonic() + timeout
    while (joined := store.add("joined", 0)) < ranks.world:
        if time.monotonic() > deadline:
            error = JoinError(f"{joined} of {ranks.world} ranks joined at {ranks.address}:"
                              f"{ranks.port} within {timeout:g} s; check that every rank was "
                              f"started (WORLD_SIZE={ranks.world}) and can reach that "
                              "address, or wait longer with --join-timeout")
            if not store.check(["rank0"]):
                error.voice = "self"  # rank 0 is missing: nobody else would say it
            raise error
        time.sleep(0.05)
    refusals = [store.get(f"refused{rank}") == b"1" for rank in range(ranks.world)]
    if any(refusals):  # the run ends here, on every rank
        _ignore_stop_signals()
        _stay_until_read(store, ranks, time.monotonic() + timeout)
    return store, refusals


def _ignore_stop_signals() -> None:
    """torchrun's agent sends a stop signal to the ranks still running when one exits:
    it must not cut short the line the rank that speaks is about to say."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def _stay_until_read(store: dist.Store, ranks: Membership, deadline: float) -> None:
    """The group will not form: the store's host keeps it until every rank has read
    the refusals (they go with it)."""
    store.add("read", 1)
    while _hosts_store(ranks) and store.add("read", 0) < ranks.world:
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _store(ranks: Membership, timeout: float) -> dist.Store:
    """The rendezvous store: hosted by rank 0, unless torchrun's agent hosts it. A rank
    that connects tries for a second at a time, so that a stop signal (handled only
    between Python calls) ends its wait at once, not after ``timeout``."""
    hosts = _hosts_store(ranks)
    deadline = time.monotonic() + timeout
    while True:
        attempt = (timeout if hosts
                   else max(0.1, min(CONNECT_ATTEMPT, deadline - time.monotonic())))
        try:
            store = dist.TCPStore(ranks.address, ranks.port, ranks.world, is_master=hosts,
                                  timeout=timedelta(seconds=attempt), wait_for_workers=False)
            break
        except RuntimeError as error:  # torch's DistNetworkError and DistStoreError
            if hosts:
                raise SplatscaleError(
                    f"MASTER_ADDR:MASTER_PORT={ranks.address}:{ranks.port}: rank 0 cannot "
                    f"listen there ({_first_line(error)})") from None
            if time.monotonic() >= deadline:
                raise UnreachableError(f"rank 0 at MASTER_ADDR:MASTER_PORT={ranks.address}:"
                                       f"{ranks.port} did not answer within {timeout:g} s; check "
                                       "that it was started and that this machine can reach "
                                       "it") from None
    store.set_timeout(timedelta(seconds=timeout))
    # A store torchrun keeps across restarts of the ranks: each attempt counts afresh.
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"splatscale/{restart}/", store)


def _hosts_store(ranks: Membership) -> bool:
    """Whether this rank hosts the rendezvous store (torchrun's agent may host it)."""
    return ranks.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__


def leave() -> None:
    """Leave the group, so that gloo's threads end while Python can still free the
    tensors their last collectives hold (at exit they would abort the process)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def agreed(call: Callable[[], T], ranks: Membership | None) -> T:
    """``call()`` on every rank, then the ranks compare notes: if any failed, the
    first of them raises its error (and says it) and every other rank stops without
    a word. Whatever ``call`` checks has then passed on all ranks, or on none."""
    if ranks is None:
        return call()
    failure: BaseException | None = None
    try:
        result = call()
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001 - compared, then raised
        failure = error
    failed = torch.zeros(ranks.world, dtype=torch.int64)
    failed[ranks.rank] = failure is not None
    collectives.all_reduce(failed)
    if failed.any():
        raise _failure_to_raise(failed.bool().tolist(), failure, ranks.rank)
    return result


class Work(Protocol[T_co]):
    """Work under way in the background (a compile): whether it has ended (once it
    has, it stays so), and, called, its result (at once, once it has ended)."""

    def done(self) -> bool: ...

    def __call__(self) -> T_co: ...


def agreed_when_done(work: Work[T], ranks: Membership | None) -> T:
    """``agreed(work, ranks)`` for work that may outlast a collective's timeout on
    some ranks (one machine's compile): the ranks first ask each other every ``POLL``
    seconds whether it has ended on all of them, so that while they wait a rank
    that dies still stops the others within the timeout. Work that never ends is
    waited for as long; a stop signal meanwhile stops this rank, and the others
    stop as having lost it."""
    if ranks is not None:
        busy = torch.ones(1, dtype=torch.int64)
        while busy.item():
            busy[0] = not work.done()
            collectives.all_reduce(busy, collectives.MAX)
            if busy.item():
                time.sleep(POLL)
    return agreed(work, ranks)


def _failure_to_raise(failed: list[bool], failure: BaseException | None,
                      rank: int) -> BaseException:
    """What this rank raises, some rank having failed (``failure``: this one's): where
    every rank met an error, this one's, said once by rank 0; else the first failed
    rank's, which it says, while every other rank stops without a word
    (``StoppedByPeer``)."""
    if failure is not None and isinstance(failure, SplatscaleError) and all(failed):
        failure.voice = "rank 0"  # every rank met it: said once, as one process says it
        return failure
    if failure is not None and failed.index(True) == rank:
        return failure
    return StoppedByPeer()


def threads_per_rank(local_world: int) -> int:
    return max(1, usable_cores() // local_world)
