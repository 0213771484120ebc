"""Where numba keeps splatscale's compiled kernels: a folder for each version of the
kernels' sources, so that no run loads a kernel compiled from other code.

numba checks a cached kernel only against its own source file's time stamp and size,
so a kernel that calls a helper or reads a constant from another module is loaded as
it was compiled after that module changed (numba's issue #1833): after an update that
edits ``render/conventions.py`` alone, binning would run on the old constants. The
folder is named for a hash of the modules that hold kernels and of every splatscale
module they import, transitively (``kernel_sources``); an edit elsewhere keeps it.

It lies under the user's NUMBA_CACHE_DIR where they set one, else under
``~/.cache/splatscale/kernels`` (XDG_CACHE_HOME's). numba reads its cache folder when
a kernel is decorated, so this runs when splatscale is imported, and numba kernels
decorated after it in the same process (a user's own) cache there too. The folder
travels in NUMBA_CACHE_DIR to the processes splatscale starts (ranks, the compile
helper); ``CHOSEN`` beside it marks it as splatscale's and ``ROOT`` keeps the user's
own NUMBA_CACHE_DIR (empty: none), so that a process of other sources, or on another
host, names its own folder. Where no folder can be made, numba caches where it would
have without splatscale. A folder that no splatscale process has imported for
``STALE_DAYS`` is removed by a run of other sources that compiles.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import Mapping

from splatscale.cache_home import default_cache_dir
from splatscale.numba_config import set_read_option

CHOSEN = "SPLATSCALE_NUMBA_CACHE_DIR"  # the NUMBA_CACHE_DIR splatscale chose
ROOT = "SPLATSCALE_NUMBA_CACHE_ROOT"  # the user's own NUMBA_CACHE_DIR ("": none)
PREFIX = "splatscale-"
FOLDER_NAME = re.compile(re.escape(PREFIX) + "[0-9a-f]{16}")  # ``sources_key``'s
STALE_DAYS = 30
PACKAGE = Path(__file__).resolve().parent
# The sources are read as text, not parsed: parsing them took ten times as long, at
# every import. tests/test_kernel_cache.py checks these against Python's parser on
# every module of the package (a relative import, say, would be missed here).
NUMBA_DECORATOR = re.compile(
    r"^\s*@(?:\w+\.)*(?:njit|jit|vectorize|guvectorize|stencil|cfunc|overload"
    r"|overload_method|overload_attribute|register_jitable|intrinsic)\b", re.M)
IMPORT = re.compile(r"^\s*import\s+([\w., ]+)", re.M)
IMPORT_FROM = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+(\([^)]*\)|[^\n]*)", re.M)
COMMENT = re.compile(r"#[^\n]*")


def key_kernel_cache() -> None:
    """Point numba's cache at the folder of these sources (``folder_for``), made, for
    every kernel decorated from now on; where it cannot be made, at the user's own
    NUMBA_CACHE_DIR (none: numba's own choice), not at another sources' folder."""
    root = _users_root(os.environ)
    try:
        folder = folder_for(os.environ, sources_key(PACKAGE))
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)  # in use: not stale (``remove_stale_folders``)
    except (OSError, RuntimeError, UnicodeDecodeError):  # RuntimeError: no home folder
        if _chosen(os.environ):
            for name in (CHOSEN, ROOT):
                os.environ.pop(name, None)
            _set_cache_dir(root)
        return
    _set_cache_dir(str(folder))
    os.environ[CHOSEN] = str(folder)
    # absolute: the compile helper starts in another working folder
    os.environ[ROOT] = str(Path(root).absolute()) if root else ""


def _set_cache_dir(folder: str) -> None:
    """numba's NUMBA_CACHE_DIR, here and in the processes this one starts ("": none)."""
    if folder:
        os.environ["NUMBA_CACHE_DIR"] = folder
    else:
        os.environ.pop("NUMBA_CACHE_DIR", None)
    set_read_option("CACHE_DIR", folder)


def folder_for(environment: Mapping[str, str], key: str) -> Path:
    """The cache folder of sources ``key``: under the user's NUMBA_CACHE_DIR
    (``_users_root``), else under the default."""
    given = _users_root(environment)
    root = Path(given) if given else default_cache_dir(environment) / "kernels"
    return root.absolute() / f"{PREFIX}{key}"


def _users_root(environment: Mapping[str, str]) -> str:
    """The NUMBA_CACHE_DIR the user gave this process, or the splatscale process that
    started it ("": none; numba reads an empty one as none)."""
    if _chosen(environment):
        return environment.get(ROOT, "")
    return environment.get("NUMBA_CACHE_DIR", "")


def _chosen(environment: Mapping[str, str]) -> bool:
    """Whether NUMBA_CACHE_DIR in ``environment`` is a splatscale process' choice."""
    given = environment.get("NUMBA_CACHE_DIR")
    return bool(given) and given == environment.get(CHOSEN)


def sources_key(package: Path) -> str:
    """A hash of ``kernel_sources(package)``: their paths within it and their text."""
    digest = hashlib.sha256()
    for path, text in _kernel_texts(package).items():
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()[:16]


def kernel_sources(package: Path) -> list[Path]:
    """The modules of ``package`` that hold numba code, and the modules of it they import,
    transitively; sorted. Hidden files (an editor's lock, say) are not modules."""
    return list(_kernel_texts(package))


def _kernel_texts(package: Path) -> dict[Path, str]:
    """``kernel_sources(package)``, in order, and their text, each file read once."""
    texts = {path: path.read_text(encoding="utf-8") for path in package.rglob("[!.]*.py")}
    found: set[Path] = set()
    to_read = [path for path, text in texts.items() if NUMBA_DECORATOR.search(text)]
    while to_read:
        path = to_read.pop()
        if path not in found:
            found.add(path)
            to_read.extend(imported_modules(texts[path], package))
    return {path: texts[path] for path in sorted(found)}


def imported_modules(text: str, package: Path) -> list[Path]:
    """The files of ``package`` that source ``text`` imports: modules, and the names
    imported from a package that are modules of it."""
    text = COMMENT.sub("", text)
    dotted = [name for names in IMPORT.findall(text) for name in _names(names)]
    for module, names in IMPORT_FROM.findall(text):
        dotted.append(module)
        dotted.extend(f"{module}.{name}" for name in _names(names))
    files = (_module_file(module, package) for module in dotted)
    return [path for path in files if path is not None]


def _names(listed: str) -> list[str]:
    """The names of an import's list (``a, b as c``, perhaps in parentheses)."""
    names = (part.split(" as ")[0].strip(" ()\\\n\t") for part in listed.split(","))
    return [name for name in names if name]


def _module_file(module: str, package: Path) -> Path | None:
    """The file of dotted ``module`` in ``package`` (a module or a package's
    ``__init__.py``), or None where it is not one of it."""
    parts = module.split(".")
    if parts[0] != package.name:
        return None
    base = package.joinpath(*parts[1:])
    candidates = [base / "__init__.py"] if len(parts) == 1 else [base.with_suffix(".py"),
                                                                   base / "__init__.py"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return None


def remove_stale_folders() -> None:
    """Mark this process' folder in use, and remove the other sources' folders beside
    it that no run has marked for ``STALE_DAYS`` (only a cache: a run that wants one
    compiles it). Nothing where numba's cache folder is not splatscale's choice."""
    if not _chosen(os.environ):
        return
    here = Path(os.environ["NUMBA_CACHE_DIR"])
    oldest = time.time() - STALE_DAYS * 86400
    try:
        os.utime(here)
        siblings = [path for path in here.parent.iterdir()
                    if FOLDER_NAME.fullmatch(path.name) and path != here]
    except OSError:
        return
    for path in siblings:
        try:
            stale = path.is_dir() and path.stat().st_mtime < oldest
        except OSError:
            continue
        if stale:
            shutil.rmtree(path, ignore_errors=True)
