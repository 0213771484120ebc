"""numba's cache folder for splatscale's kernels: one for each version of their sources,
so that a kernel compiled before a module it imports changed is never loaded."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from numba.core.registry import CPUDispatcher

from splatscale import kernel_cache
from splatscale.kernel_cache import (CHOSEN, PREFIX, ROOT, STALE_DAYS, folder_for,
                                     imported_modules, kernel_sources, remove_stale_folders,
                                     sources_key)

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
    default = tmp_path / "splatscale" / "kernels" / f"{PREFIX}k"
    assert folder_for({"XDG_CACHE_HOME": str(tmp_path)}, "k") == default
    # numba reads an empty NUMBA_CACHE_DIR as none
    assert folder_for({"XDG_CACHE_HOME": str(tmp_path), "NUMBA_CACHE_DIR": ""}, "k") == default


def test_a_process_of_other_sources_names_its_own_folder_where_its_parent_chose(tmp_path):
    parents = str(tmp_path / f"{PREFIX}parent")
    inherited = {"NUMBA_CACHE_DIR": parents, CHOSEN: parents, ROOT: str(tmp_path)}
    assert folder_for(inherited, "child") == tmp_path / f"{PREFIX}child"
    # the parent's default, resolved against this process' own home
    inherited = {"NUMBA_CACHE_DIR": parents, CHOSEN: parents, ROOT: "",
                 "XDG_CACHE_HOME": str(tmp_path / "here")}
    assert folder_for(inherited, "child") == (
        tmp_path / "here" / "splatscale" / "kernels" / f"{PREFIX}child")


def test_the_imports_read_as_text_are_those_python_parses():
    """``kernel_sources`` reads imports with patterns, not Python's parser (which took
    ten times as long at every import): for every module of the package, the same."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parsed = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                dotted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: a relative import"
                dotted = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            parsed.update(kernel_cache._module_file(name, PACKAGE) for name in dotted)
        parsed.discard(None)
        assert set(imported_modules(path.read_text(), PACKAGE)) == parsed, path


def test_every_kernel_is_in_a_module_the_key_reads():
    kernels = []
    for module in pkgutil.walk_packages([str(PACKAGE)], "splatscale."):
        if module.name.endswith("__main__"):
            continue
        namespace = vars(importlib.import_module(module.name))
        kernels += [value for value in namespace.values() if isinstance(value, CPUDispatcher)]
    assert len(kernels) > 20
    sources = {str(path) for path in kernel_sources(PACKAGE)}
    for kernel in kernels:
        assert kernel.py_func.__code__.co_filename in sources, kernel


def test_an_editors_lock_file_in_the_package_is_no_module(package_copy):
    before = sources_key(package_copy)
    (package_copy / "render" / ".#binning.py").symlink_to("nowhere@1234")
    assert sources_key(package_copy) == before


def printed_by(command: str, environment: dict[str, str], cwd: Path | None = None) -> str:
    """What ``python -c command`` prints, stripped."""
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True,
                          env=environment, cwd=cwd, timeout=HANG_GUARD, check=True)
    return done.stdout.strip()


def test_splatscale_and_the_processes_it_starts_cache_in_one_folder(tmp_path):
    environment = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    environment.pop(CHOSEN, None)
    ours = tmp_path / f"{PREFIX}{sources_key(PACKAGE)}"
    show = "import os, splatscale; print(os.environ['NUMBA_CACHE_DIR'])"
    assert printed_by(show, environment) == str(ours)
    assert ours.is_dir()
    child = ("import os, subprocess, sys, splatscale; subprocess.run([sys.executable, '-c', "
             f"{show!r}], check=True)")
    assert printed_by(child, environment) == str(ours)
    # numba imported before splatscale: its configuration is set as well
    first = "import numba, splatscale; from numba.core import config; print(config.CACHE_DIR)"
    assert printed_by(first, environment) == str(ours)


def test_where_no_folder_can_be_made_numba_caches_where_it_would_have(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    environment = {**os.environ, "NUMBA_CACHE_DIR": str(not_a_folder)}
    environment.pop(CHOSEN, None)
    show = "import os, splatscale; print(os.environ['NUMBA_CACHE_DIR'])"
    assert printed_by(show, environment) == str(not_a_folder)


def test_a_relative_numba_cache_dir_reaches_children_as_the_same_folder(tmp_path):
    environment = {**os.environ, "NUMBA_CACHE_DIR": "relative"}
    environment.pop(CHOSEN, None)
    show = ("import os, splatscale; print(os.environ['NUMBA_CACHE_DIR'], "
            f"os.environ[{ROOT!r}])")
    folder, root = printed_by(show, environment, cwd=tmp_path).split()
    assert root == str(tmp_path / "relative") and Path(folder).parent == Path(root)


def test_a_child_of_other_sources_without_a_folder_leaves_numba_its_own(tmp_path):
    """Where a process cannot make its folder, it does not cache in its parent's, of
    other sources: NUMBA_CACHE_DIR is the user's again."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    parents = str(not_a_folder / f"{PREFIX}{'0' * 16}")
    environment = {**os.environ, "NUMBA_CACHE_DIR": parents, CHOSEN: parents,
                   ROOT: str(not_a_folder)}
    show = ("import os, splatscale; print(os.environ['NUMBA_CACHE_DIR'], "
            f"{CHOSEN!r} in os.environ)")
    assert printed_by(show, environment).split() == [str(not_a_folder), "False"]


def stale(*folders: Path) -> None:
    """Mark ``folders`` unused for longer than ``STALE_DAYS``."""
    weeks_ago = time.time() - (STALE_DAYS + 1) * 86400
    for folder in folders:
        os.utime(folder, (weeks_ago, weeks_ago))


def test_folders_unused_for_weeks_are_removed_when_a_run_compiles(tmp_path, monkeypatch):
    here, recent, old = (tmp_path / f"{PREFIX}{digit * 16}" for digit in "012")
    others = [tmp_path / "someone-elses", tmp_path / f"{PREFIX}site"]
    for folder in (here, recent, old, *others):
        folder.mkdir()
    stale(here, old, *others)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(here))
    monkeypatch.setenv(CHOSEN, str(here))
    remove_stale_folders()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [here.name, recent.name, *(folder.name for folder in others)])
    assert here.stat().st_mtime > time.time() - 86400  # marked in use


def test_nothing_is_pruned_where_numba_caches_elsewhere_than_splatscale_chose(tmp_path,
                                                                          monkeypatch):
    old = tmp_path / f"{PREFIX}{'0' * 16}"
    old.mkdir()
    stale(old)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "theirs"))
    monkeypatch.setenv(CHOSEN, str(tmp_path / f"{PREFIX}{'1' * 16}"))
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
