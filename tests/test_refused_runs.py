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


def checkpoint_field(part: str, name: str, value) -> Callable[[Path], list[str]]:
    """A checkpoint whose ``part`` (None: the top level) has ``name`` set to ``value``."""
    def edit(base: Path) -> list[str]:
        path = base / "run" / "checkpoint.pt"
        state = torch.load(path, weights_only=False)
        (state if part is None else state[part])[name] = value
        torch.save(state, path)
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
