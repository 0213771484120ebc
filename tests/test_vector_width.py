"""numba compiles for 512-bit vectors where the host has AVX-512, unless told a target."""

from __future__ import annotations

import os
import subprocess
import sys

import llvmlite.binding as llvm
import numba
import pytest
from llvmlite.binding import FeatureMap

from splatscale import vector_width

HOST_HAS_AVX512 = vector_width.full_vector_features() is not None

# A loop LLVM vectorises, compiled in a fresh process after ``PRELUDE``; prints whether
# its code uses 512-bit registers and the features numba compiled for.
PROBE = """
import numpy as np, numba
{prelude}
@numba.njit
def scaled(values, factors):
    for i in range(values.shape[0]):
        values[i] = values[i] * factors[i]
scaled(np.ones(4096, np.float32), np.ones(4096, np.float32))
code = next(iter(scaled.inspect_asm().values()))
print("zmm" in code, numba.config.CPU_FEATURES)
"""


def probe(prelude: str, **environment: str) -> tuple[bool, str]:
    named = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_ENABLE_AVX", vector_width.CHOSEN)
    clean = {k: v for k, v in os.environ.items() if k not in named}
    out = subprocess.run([sys.executable, "-c", PROBE.format(prelude=prelude)],
                         env={**clean, **environment}, capture_output=True, text=True,
                         check=True, timeout=300).stdout.split(maxsplit=1)
    return out[0] == "True", out[1].strip()


def features(**flags: bool) -> FeatureMap:
    feature_map = FeatureMap()
    feature_map.update(flags)
    return feature_map


@pytest.fixture
def host(monkeypatch):
    """An x86-64 host with AVX-512, no target named and none made yet (this process has
    made one: ``test_a_target_numba_made_before_is_kept`` covers that): numba's
    variables, the marker and numba's configured features are restored after the test,
    whatever it set."""
    for name in ("NUMBA_CPU_FEATURES", "NUMBA_CPU_NAME", "NUMBA_ENABLE_AVX",
                 vector_width.CHOSEN):
        monkeypatch.setenv(name, "")  # recorded, so that teardown restores it
        monkeypatch.delenv(name)
    monkeypatch.setattr(numba.config, "CPU_FEATURES", numba.config.CPU_FEATURES)
    monkeypatch.setattr(vector_width.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: features(avx512f=True))
    monkeypatch.setattr(vector_width, "_target_made", lambda: False)
    return monkeypatch


def test_the_preference_is_dropped_only_where_the_host_has_avx512(monkeypatch):
    monkeypatch.setattr(llvm, "get_host_cpu_features",
                        lambda: features(avx2=True, avx512f=True, sse2=True))
    assert vector_width.full_vector_features() == "+avx2,+avx512f,+sse2,-prefer-256-bit"
    monkeypatch.setattr(llvm, "get_host_cpu_features",
                        lambda: features(avx2=True, avx512f=False))
    assert vector_width.full_vector_features() is None


def test_a_host_llvm_cannot_ask_keeps_numbas_own_target(monkeypatch):
    def unknown() -> FeatureMap:
        raise RuntimeError("failed to get host cpu features.")

    monkeypatch.setattr(llvm, "get_host_cpu_features", unknown)
    assert vector_width.full_vector_features() is None


def test_the_features_chosen_reach_numba_and_the_processes_started_here(host):
    vector_width.prefer_full_vectors()
    assert (os.environ["NUMBA_CPU_FEATURES"] == os.environ[vector_width.CHOSEN]
            == numba.config.CPU_FEATURES == "+avx512f,-prefer-256-bit")
    assert vector_width.chosen_by_splatscale(os.environ)


def test_other_architectures_keep_numbas_own_target(host):
    host.setattr(vector_width.platform, "machine", lambda: "arm64")
    vector_width.prefer_full_vectors()
    assert "NUMBA_CPU_FEATURES" not in os.environ and numba.config.CPU_FEATURES is None


def test_features_chosen_on_another_host_are_chosen_again_here(host):
    """A job's environment forwarded from a machine with AVX-512 to one without."""
    host.setenv("NUMBA_CPU_FEATURES", "+avx512f,+amx-tile,-prefer-256-bit")
    host.setenv(vector_width.CHOSEN, "+avx512f,+amx-tile,-prefer-256-bit")
    vector_width.prefer_full_vectors()
    assert os.environ["NUMBA_CPU_FEATURES"] == "+avx512f,-prefer-256-bit"
    host.setattr(llvm, "get_host_cpu_features", lambda: features(avx2=True))
    vector_width.prefer_full_vectors()
    assert "NUMBA_CPU_FEATURES" not in os.environ and vector_width.CHOSEN not in os.environ


@pytest.mark.parametrize("variable", ["NUMBA_CPU_FEATURES", "NUMBA_CPU_NAME",
                                      "NUMBA_ENABLE_AVX"])
def test_a_target_the_user_names_is_kept(host, variable):
    host.setenv(variable, "+sse2" if variable == "NUMBA_CPU_FEATURES" else "1")
    vector_width.prefer_full_vectors()
    assert os.environ.get("NUMBA_CPU_FEATURES") == (
        "+sse2" if variable == "NUMBA_CPU_FEATURES" else None)


@pytest.mark.skipif(not HOST_HAS_AVX512, reason="the host has no AVX-512")
@pytest.mark.parametrize("prelude", ["import splatscale",
                                     "import numba.core.registry\nimport splatscale"])
def test_kernels_compile_to_512_bit_vectors(prelude):
    """Whether splatscale is imported before numba or after it."""
    wide, compiled_for = probe(prelude)
    assert wide and compiled_for.endswith(vector_width.WITHOUT_PREFERENCE)


@pytest.mark.skipif(not HOST_HAS_AVX512, reason="the host has no AVX-512")
def test_a_target_numba_made_before_is_kept():
    """A kernel decorated before splatscale is imported: numba has made its target."""
    made_first = "@numba.njit\ndef f(x):\n    return x\nimport splatscale"
    assert probe(made_first) == probe("")


@pytest.mark.skipif(not HOST_HAS_AVX512, reason="the host has no AVX-512")
def test_the_users_features_are_what_numba_compiles_for():
    """The host's own features, with LLVM's tuning for its core (256 bits on Intel's)."""
    narrow = llvm.get_host_cpu_features().flatten()
    wide, compiled_for = probe("import splatscale", NUMBA_CPU_FEATURES=narrow)
    assert compiled_for == narrow
    assert wide == probe("", NUMBA_CPU_FEATURES=narrow)[0] == probe("")[0]
