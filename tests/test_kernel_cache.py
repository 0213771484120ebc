"""numba's cache folder for splatscale's kernels: one for each version of their sources,
so that a kernel compiled before a module it imports changed is never loaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from splatscale import kernel_cache
from splatscale.kernel_cache import (CHOSEN, PREFIX, ROOT, STALE_DAYS, folder_for,
                                     kernel_sources, remove_stale_folders, sources_key)

PACKAGE = kernel_cache.PACKAGE
HANG_GUARD = 600


@pytest.fixture
def package_copy(tmp_path) -> Path:
    """A copy of the splatscale package's sources, to edit."""
    copy = tmp_path / "src" / "splatscale"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_the_kernels_sources_are_their_modules_and_what_they_import():
    relative = {path.relative_to(PACKAGE).as_posix() for path in kernel_sources(PACKAGE)}
    assert {"render/projection_kernels.py", "render/compositing_kernels.py",
            "render/binning.py", "render/sh_kernels.py", "step/ssim.py",
            "step/adam_kernels.py"} <= relative
    # imported by kernels: a constant's module, a helper's
    assert {"render/conventions.py", "render/exact_exp.py"} <= relative
    assert not {"commands.py", "cli.py", "viewer/server.py"} & relative


def test_a_change_to_a_module_kernels_import_changes_the_key(package_copy):
    before = sources_key(package_copy)
    conventions = package_copy / "render" / "conventions.py"
    conventions.write_text(conventions.read_text() + "\nANOTHER = 1\n")
    assert sources_key(package_copy) != before


def test_a_change_elsewhere_keeps_the_key(package_copy):
    before = sources_key(package_copy)
    commands = package_copy / "commands.py"
    commands.write_text(commands.read_text() + "\n# an edit\n")
    assert sources_key(package_copy) == before


def test_the_folder_lies_under_the_users_numba_cache_dir_or_the_default(tmp_path):
    assert folder_for({"NUMBA_CACHE_DIR": str(tmp_path)}, "k") == tmp_path / f"{PREFIX}k"
    default = folder_for({"XDG_CACHE_HOME": str(tmp_path)}, "k")
    assert default == tmp_path / "splatscale" / "kernels" / f"{PREFIX}k"


def test_a_process_of_other_sources_names_its_own_folder_where_its_parent_chose(tmp_path):
    parents = tmp_path / f"{PREFIX}parent"
    inherited = {"NUMBA_CACHE_DIR": str(parents), CHOSEN: str(parents), ROOT: str(tmp_path)}
    assert folder_for(inherited, "child") == tmp_path / f"{PREFIX}child"


def printed_by(command: str, environment: dict[str, str], cwd: Path | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True,
                          env=environment, cwd=cwd, timeout=HANG_GUARD, check=True)
    return done.stdout.strip()


def test_splatscale_and_the_processes_it_starts_cache_in_one_folder(tmp_path):
    environment = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    environment.pop(CHOSEN, None)
    ours = tmp_path / f"{PREFIX}{sources_key(PACKAGE)}"
    show = "import os, splatscale; print(os.environ['NUMBA_CACHE_DIR'])"
    assert printed_by(show, environment) == str(ours)
    child = ("import os, subprocess, sys, splatscale; subprocess.run([sys.executable, '-c', "
             f"{show!r}], check=True)")
    assert printed_by(child, environment) == str(ours)
    # numba imported before splatscale: its configuration is set as well
    first = "import numba, splatscale; from numba.core import config; print(config.CACHE_DIR)"
    assert printed_by(first, environment) == str(ours)


def test_folders_unused_for_weeks_are_removed_when_a_run_compiles(tmp_path, monkeypatch):
    here, recent, old = (tmp_path / f"{PREFIX}{name}" for name in ("here", "recent", "old"))
    others = tmp_path / "someone-elses"
    for folder in (here, recent, old, others):
        folder.mkdir()
    weeks_ago = time.time() - (STALE_DAYS + 1) * 86400
    for folder in (here, old, others):
        os.utime(folder, (weeks_ago, weeks_ago))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(here))
    monkeypatch.setenv(CHOSEN, str(here))
    remove_stale_folders()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [here.name, recent.name, others.name])


def test_a_users_own_numba_cache_dir_is_not_pruned(tmp_path, monkeypatch):
    old = tmp_path / f"{PREFIX}old"
    old.mkdir()
    weeks_ago = time.time() - (STALE_DAYS + 1) * 86400
    os.utime(old, (weeks_ago, weeks_ago))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "theirs"))
    monkeypatch.delenv(CHOSEN, raising=False)
    remove_stale_folders()
    assert old.exists()


BINNED = """
import torch
import splatscale
from splatscale.render.binning import bin_tiles
bins = bin_tiles(torch.tensor([[40.0, 40.0]]), torch.tensor([[30, 30]], dtype=torch.int32),
                 torch.ones(1), torch.zeros(1, dtype=torch.int64), 96, (0, 96),
                 conics=torch.tensor([[0.01, 0.0, 0.01]]), opacities=torch.tensor([0.05]))
print(splatscale.__file__, len(bins.splat_ids))
"""


@pytest.mark.slow
def test_an_edit_to_a_constant_kernels_import_reaches_them(package_copy, tmp_path):
    """Binning's kernels read ALPHA_MIN from render/conventions.py: after an edit there
    alone (binning.py untouched), the next process bins with the new value. numba's
    own cache check would load the kernels compiled with the old one."""
    environment = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    environment.pop(CHOSEN, None)
    where, faint = printed_by(BINNED, environment, cwd=package_copy.parent).split()
    assert Path(where).parent == package_copy
    conventions = package_copy / "render" / "conventions.py"
    text = conventions.read_text()
    assert "\nALPHA_MIN = " in text
    conventions.write_text(text.replace("\nALPHA_MIN = ", "\nALPHA_MIN = 10 * "))
    assert int(printed_by(BINNED, environment, cwd=package_copy.parent).split()[1]) < int(faint)
