"""A refused run changes nothing: every check that can fail runs before the first byte
of the output folder changes, whatever the flags (a new folder, --overwrite, --resume)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch

from splatscale.cli import main
from splatscale.folder_lock import LOCK_NAME
from tests.conftest import data_path
from tests.test_bad_input import assert_clean_error


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Path:
    """A finished demo run (with its image cache beside it), copied by each test."""
    base = tmp_path_factory.mktemp("earlier")
    assert main(["train", "-o", str(base / "run"), "--iterations", "10", "--quiet",
                 "--cache-dir", str(base / "cache")]) == 0
    return base


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) below ``folder``, by relative path."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def file_as_cache(base: Path) -> list[str]:
    (base / "a-file").write_text("not a folder")
    return ["--cache-dir", str(base / "a-file")]


def truncated_image(base: Path) -> list[str]:
    image = base / "cache" / "demo-v1" / "view_005.png"
    image.write_bytes(image.read_bytes()[:600])  # its header reads; its pixels do not
    return []


def locked(base: Path) -> list[str]:
    import os
    import socket

    (base / "run" / LOCK_NAME).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    return []


def torn_checkpoint(base: Path) -> list[str]:
    checkpoint = base / "run" / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    return []


# Edits of a part of a checkpoint that a plain value cannot say.
EDITS = {
    "seed-overflow": lambda config: {**config, "seed": 2 ** 70},
    "short": lambda order: order[:3],
    "no-moments": lambda optimizer: {**optimizer, "exp_avg": {}},
    "nan": lambda model: {**model, "means": model["means"].index_fill(0, torch.tensor([0]),
                                                                      float("nan"))},
    "float-sh": lambda config: {**config, "sh_degree": 2.0},
}


def checkpoint_field(part: str, name: str, value) -> Callable[[Path], list[str]]:
    """A checkpoint whose ``part`` (None: the top level) has ``name`` set to ``value``
    (or edited by ``EDITS[value]``)."""
    def edit(base: Path) -> list[str]:
        path = base / "run" / "checkpoint.pt"
        state = torch.load(path, weights_only=False)
        holder = state if part is None else state[part]
        holder[name] = EDITS[value](holder[name]) if value in EDITS else value
        torch.save(state, path)
        return []
    return edit


def metrics_line(line: str) -> Callable[[Path], list[str]]:
    def edit(base: Path) -> list[str]:
        with open(base / "run" / "metrics.jsonl", "a") as log:
            log.write(line + "\n")
        return []
    return edit


def record_field(name: str, value) -> Callable[[Path], list[str]]:
    """The run's config.json with ``name`` set to ``value``."""
    def edit(base: Path) -> list[str]:
        path = base / "run" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), name: value}))
        return []
    return edit


def flags(*given: str) -> Callable[[Path], list[str]]:
    return lambda base: list(given)


# name: (what breaks the run, a fragment of its one line, the modes it applies to)
ALL = ("new", "--overwrite", "--resume")
CASES = {
    "cache folder is a file": (file_as_cache, "Not a directory", ALL),
    "an image whose pixels do not decode": (truncated_image, "view_005.png", ALL),
    "another run holds the lock": (locked, "is writing here", ("--overwrite", "--resume")),
    "a batch larger than the views": (flags("--batch-size", "40"), "a batch holds distinct",
                                      ("new", "--overwrite")),
    "no GPU": (flags("--device", "cuda"), "--device cuda", ALL),
    "both forwarding flags": (flags("--offload", "--forwarding", "--no-forwarding"),
                              "not allowed with argument", ALL),
    "a torn checkpoint": (torn_checkpoint, "not a readable checkpoint", ("--resume",)),
    "another scene": (flags(str(data_path("snowmiku"))), "a checkpoint of another scene",
                      ("--resume",)),
    "images seen not a count": (checkpoint_field("trainer", "images_seen", "x"),
                                "images_seen must be a count", ("--resume",)),
    "images seen below zero": (checkpoint_field("trainer", "images_seen", -5),
                               "images_seen must be a count", ("--resume",)),
    "a format that is text": (checkpoint_field(None, "format", "2"),
                              "its format is '2', not a format number", ("--resume",)),
    "a setting out of range": (checkpoint_field("trainer", "sh_degree", 7),
                               "sh_degree must be an SH degree", ("--resume",)),
    "a record's resolution": (record_field("resolution", 3),
                              "config.json: resolution must be 1, 2, 4 or 8", ("--resume",)),
    "random points beside SfM points": (flags(str(data_path("snowmiku")), "--random-init",
                                              "cube"),
                                        "--random-init cube", ("new", "--overwrite")),
    "a save past the end": (flags("--save-at", "13"), "--save-at 13: after the run's end",
                            ALL),
    "a save the resumed run is past": (flags("--save-at", "5"), "--save-at 5: the resumed run",
                                       ("--resume",)),
    "tests without test views": (flags("--eval-every", "4"), "--eval-every: only with --eval",
                                 ("new", "--overwrite")),
    "tests past the end": (flags("--eval", "--eval-every", "1000"),
                           "--eval-every 1000: past the run's end", ("new", "--overwrite")),
    "ranks' flags alone": (flags("--balance", "uniform"), "--balance: only with several ranks",
                           ALL),
    "a seed too large for the checkpoint": (checkpoint_field("trainer", "config",
                                                             "seed-overflow"),
                                            "seed must be an integer from 0 to", ("--resume",)),
    "a random state that is not one": (checkpoint_field("rng", "torch", "x"),
                                       "its torch random state is not one", ("--resume",)),
    "an order of the wrong size": (checkpoint_field("trainer", "order", "short"),
                                   "its order must be a random generator's state",
                                   ("--resume",)),
    "steps that do not add up": (checkpoint_field("trainer", "steps", 10 ** 12),
                                 "is not its steps", ("--resume",)),
    "an optimiser without moments": (checkpoint_field("engine", "optimizer", "no-moments"),
                                     "its optimiser state does not match", ("--resume",)),
    "a NaN in the model": (checkpoint_field("engine", "model", "nan"),
                           "of its Gaussians are NaN or infinite", ("--resume",)),
    "a float SH degree": (checkpoint_field("trainer", "config", "float-sh"),
                          "sh_degree must be 0 or 1 or 2 or 3, not 2.0", ("--resume",)),
    "fewer images than trained": (flags("--iterations", "5"), "has already trained on 10",
                                  ("--resume",)),
}


@pytest.mark.parametrize("case, mode", [(case, mode) for case, (_, _, modes) in CASES.items()
                                        for mode in modes])
def test_a_refused_run_changes_nothing(case, mode, earlier_run, tmp_path, capsys):
    if case == "no GPU" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    shutil.copytree(earlier_run, tmp_path, dirs_exist_ok=True)
    breaks, fragment, _ = CASES[case]
    extra = breaks(tmp_path)
    output = tmp_path / "new" / "run" if mode == "new" else tmp_path / "run"
    before = snapshot(tmp_path / "run")
    mode_flags = [] if mode == "new" else [mode]
    try:
        code = main(["train", "-o", str(output), "--iterations", "12", "--quiet",
                     "--cache-dir", str(tmp_path / "cache"), *mode_flags, *extra])
    except SystemExit as usage_error:  # argparse's refusals
        code = usage_error.code
    assert_clean_error(code, capsys.readouterr().err, fragment)
    assert snapshot(tmp_path / "run") == before
    assert not (tmp_path / "new").exists(), "a refused new run leaves no folder behind"


def test_a_refused_run_through_dot_dot_leaves_no_folder(earlier_run, tmp_path, capsys):
    code = main(["train", "-o", str(tmp_path / "a" / ".." / "b"), "--batch-size", "40",
                 "--quiet", "--cache-dir", str(earlier_run / "cache")])
    assert_clean_error(code, capsys.readouterr().err, "a batch holds distinct views")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("variables, fragment", [
    ({"WORLD_SIZE": "2"}, "environment variable RANK is not set, but WORLD_SIZE=2 is"),
    ({"WORLD_SIZE": "two"}, "environment variable WORLD_SIZE='two': not an integer"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "environment variable RANK=2: must be between 0 and 1"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"},
     "environment variable MASTER_PORT=99999: must be between 1 and 65535"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "29500"},
     "environment variable MASTER_ADDR is not set"),
    ({"RANK": "0"}, "environment variable RANK='0' is set, but WORLD_SIZE is not"),
])
def test_the_launchers_environment_is_checked_as_input(variables, fragment, earlier_run,
                                                        tmp_path, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    shutil.copytree(earlier_run, tmp_path, dirs_exist_ok=True)
    before = snapshot(tmp_path / "run")
    code = main(["train", "-o", str(tmp_path / "run"), "--overwrite", "--quiet",
                 "--cache-dir", str(tmp_path / "cache")])
    assert_clean_error(code, capsys.readouterr().err, fragment)
    assert snapshot(tmp_path / "run") == before


def test_a_variable_every_rank_is_given_alike_is_said_by_rank_0(tmp_path, capsys,
                                                                 monkeypatch):
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    code = main(["train", "-o", str(tmp_path / "run"), "--quiet"])
    assert code == 2 and capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["train", "prepare"])
def test_an_empty_output_path_is_refused(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    given = ["prepare", str(tmp_path)] if command == "prepare" else ["train"]
    with pytest.raises(SystemExit) as refused:
        main([*given, "-o", ""])
    assert_clean_error(refused.value.code, capsys.readouterr().err, "-o", "an empty path")
    assert list(tmp_path.iterdir()) == []


def test_a_log_line_that_is_no_entry_is_dropped_on_resume(earlier_run, tmp_path):
    shutil.copytree(earlier_run, tmp_path, dirs_exist_ok=True)
    metrics_line('[1, 2]')(tmp_path)
    metrics_line('{"images": "x"}')(tmp_path)
    assert main(["train", "-o", str(tmp_path / "run"), "--resume", "--iterations", "12",
                 "--quiet", "--cache-dir", str(tmp_path / "cache")]) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert all(isinstance(json.loads(line).get("images"), int) for line in lines)
