"""Ranks speak with one voice, signals reach every rank, a run whose ranks cannot meet
says so in one line, and a process that has finished exits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from splatscale.errors import QUIET_EXIT
from splatscale.folder_lock import LOCK_NAME
from tests.conftest import HANG_GUARD, wait_until
from tests.test_bad_input import assert_clean_error
from tests.test_distributed import children_of
from tests.test_refused_runs import snapshot

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="watches ranks in /proc")


def splatscale(*args: str, **options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "splatscale", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)


def finished(process: subprocess.Popen) -> tuple[int, str]:
    _, err = process.communicate(timeout=HANG_GUARD)
    return process.returncode, err


def train(out: Path, cache: Path, *flags: str) -> subprocess.Popen:
    return splatscale("train", "-o", str(out), "--quiet", "--cache-dir", str(cache), *flags)


def under_way(out: Path, process: subprocess.Popen) -> None:
    """Wait for the first log line: every rank is training."""
    wait_until((out / "metrics.jsonl").is_file, "the first log line", process)


def images_saved(out: Path) -> int:
    return torch.load(out / "checkpoint.pt", weights_only=False)["trainer"]["images_seen"]


def resumes(out: Path, cache: Path) -> None:
    """The checkpoint continues, in one process, for four more images."""
    saved = images_saved(out)
    code, err = finished(train(out, cache, "--resume", "--iterations", str(saved + 4)))
    assert code == 0, err
    assert json.loads((out / "report.json").read_text())["iterations"] == saved + 4


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("two-ranks")
    code, err = finished(train(base / "run", base / "cache", "--iterations", "20",
                               "--nproc", "2"))
    assert code == 0, err
    return base


def test_a_failure_on_rank_1_is_said_by_rank_1_alone(two_rank_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_rank_run / "run", run)
    next(run.glob("checkpoint.pt.*.rank1-of-2")).unlink()
    before = snapshot(run)
    code, err = finished(train(run, two_rank_run / "cache", "--resume", "--iterations", "30",
                               "--nproc", "2"))
    assert_clean_error(code, err, "error: rank 1: ", "rank1-of-2: a shard of", "unreadable")
    assert snapshot(run) == before


def test_a_held_folder_is_refused_before_any_rank_starts(two_rank_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_rank_run / "run", run)
    (run / LOCK_NAME).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    before = snapshot(run)
    process = train(run, two_rank_run / "cache", "--resume", "--nproc", "2")

    def refused() -> bool:  # no rank is seen from start to end
        assert children_of(process.pid) == [], "no rank is spawned"
        return process.poll() is not None
    wait_until(refused, "the launcher to refuse the run", every=0.05)
    code, err = finished(process)
    assert_clean_error(code, err, f"process {os.getpid()}", "is writing here")
    assert snapshot(run) == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_reaches_every_rank(signum, two_rank_run, tmp_path):
    """The ranks finish their step, save a checkpoint that resumes, and exit 130."""
    out = tmp_path / "run"
    process = train(out, two_rank_run / "cache", "--iterations", "100000",
                    "--checkpoint-every", "0", "--nproc", "2")
    under_way(out, process)
    process.send_signal(signum)
    code, err = finished(process)
    assert code == 130, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 2, err
    assert "finishing this step to save a checkpoint" in lines[0]
    assert "checkpoint.pt is saved, and splatscale train -o" in lines[1]
    resumes(out, two_rank_run / "cache")


@pytest.mark.parametrize("delay", [0.0, 1.5, 3.0])
def test_a_signal_while_ranks_start_stops_them_quietly(delay, two_rank_run, tmp_path):
    """Sent as the ranks start, or while they load torch and numpy (an import cut
    short fails oddly), or while they read the scene."""
    out = tmp_path / "run"
    process = train(out, two_rank_run / "cache", "--iterations", "100000", "--nproc", "2")
    wait_until(lambda: len(children_of(process.pid)) >= 2, "both ranks started", process,
               every=0.05)
    time.sleep(delay)  # the moment the signal lands; the verdict holds at any
    process.send_signal(signal.SIGINT)
    code, err = finished(process)
    assert code == 130 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines == ["splatscale: interrupted"] or (
        len(lines) == 2 and "finishing this step" in lines[0]
        and "--resume continues the run" in lines[1]), err


def test_ranks_whose_launcher_dies_stop_with_a_checkpoint(two_rank_run, tmp_path):
    out = tmp_path / "run"
    process = train(out, two_rank_run / "cache", "--iterations", "100000",
                    "--checkpoint-every", "0", "--nproc", "2")
    under_way(out, process)
    ranks = children_of(process.pid)
    assert len(ranks) == 2, ranks
    process.kill()
    process.wait()
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks),
               "the ranks to stop")
    assert images_saved(out) > 0
    (out / LOCK_NAME).unlink()  # the launcher's, left by its kill -9
    resumes(out, two_rank_run / "cache")


def test_a_rank_whose_peers_never_arrive_says_how_many_joined(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = dict(os.environ, WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
    code, err = finished(splatscale("train", "-o", str(tmp_path / "run"), "--quiet",
                                    "--join-timeout", "2", env=environment))
    assert_clean_error(code, err, "1 of 2 ranks joined at 127.0.0.1:", "within 2 s")
    assert not (tmp_path / "run").exists()

    environment.update(RANK="1", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")  # no rank 0 answers
    code, err = finished(splatscale("train", "-o", str(tmp_path / "run"), "--quiet",
                                    "--join-timeout", "2", env=environment))
    assert_clean_error(code, err, "rank 0 at MASTER_ADDR:MASTER_PORT=127.0.0.1:",
                       "did not answer within 2 s")


def torchrun_ranks(flags: list[list[str]]) -> list[tuple[int, str]]:
    """Each of ``flags``' command lines run as one rank of a group, as torchrun starts
    them; every rank's exit status and stderr."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [splatscale("train", *command, env=dict(
        os.environ, WORLD_SIZE=str(len(flags)), RANK=str(rank), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(len(flags)), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
        for rank, command in enumerate(flags)]
    return [finished(process) for process in ranks]


def test_a_refusal_every_rank_meets_is_said_once(tmp_path):
    run = ["-o", str(tmp_path / "run"), "--quiet", "--join-timeout", str(HANG_GUARD)]
    for wrong, said in ((["--forwarding"], "--forwarding: only with --offload"),
                        (["--batch-size", "0"], "argument --batch-size")):
        (code, err), (quiet_code, quiet_err) = torchrun_ranks([run + wrong, run + wrong])
        assert_clean_error(code, err, said)
        assert "rank 0" not in err
        assert quiet_code in (2, QUIET_EXIT) and quiet_err == ""
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("launcher, wrong", [
    (["--standalone"], ["--forwarding"]),            # a flag, checked before the ranks meet
    (["--standalone"], ["--batch-size", "0"]),       # argparse's
    (["--master-port", "0"], []),                    # a variable torchrun gives all ranks
])
def test_under_torchrun_a_refusal_is_said_once(tmp_path, launcher, wrong):
    """torchrun's agent stops the ranks still running when one exits: the refusal is
    said once all the same, and nothing is written."""
    agent = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *launcher,
         "-m", "splatscale", "train", "-o", str(tmp_path / "run"), *wrong],
        capture_output=True, text=True, timeout=HANG_GUARD)
    said = [line for line in agent.stderr.splitlines() if line.startswith("splatscale:")]
    assert len(said) == 1 and said[0].startswith("splatscale: error: "), agent.stderr
    assert "rank" not in said[0] and "interrupted" not in agent.stderr
    assert not (tmp_path / "run").exists()


def test_a_refusal_one_rank_meets_is_said_by_that_rank_alone(tmp_path):
    """Checks that need no other rank (flags, the device) run before the ranks meet;
    the ranks still stop together, and only the one that refused says why."""
    run = ["-o", str(tmp_path / "run"), "--quiet", "--join-timeout", str(HANG_GUARD)]
    (code, err), (refused_code, refused_err) = torchrun_ranks([run, run + ["--forwarding"]])
    assert_clean_error(refused_code, refused_err, "error: rank 1: --forwarding: only with")
    assert (code, err) == (QUIET_EXIT, "")
    assert not (tmp_path / "run").exists()


def test_more_ranks_than_cores_are_refused(tmp_path):
    cores = len(os.sched_getaffinity(0))
    code, err = finished(splatscale("train", "-o", str(tmp_path / "run"), "--nproc",
                                    str(cores + 1)))
    assert_clean_error(code, err, f"argument --nproc: must be between 1 and {cores}")
