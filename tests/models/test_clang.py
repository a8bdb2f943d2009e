"""The C kernels built with clang (full tier; CI installs Debian's clang and libomp-dev).

clang's OpenMP is LLVM's runtime (libomp), where PyPI's torch runs GNU's (libgomp): beside such
a torch the loader refuses a clang build with one warning, and the PyTorch paths run. On one
runtime, as with a torch built against LLVM's OpenMP (here: LLVM's preloaded, so torch's calls
reach it too), each clang build passes the kernel tests."""

from __future__ import annotations

import sys

import pytest

from foxhunt.models import cpu_kernels
from tests.models.kernel_builds import build, library_of, load_in_process, run_kernel_tests

LIBOMP = library_of("clang", "libomp.so.5")
needs_clang = pytest.mark.skipif(
    not sys.platform.startswith("linux") or LIBOMP is None,
    reason="no clang with LLVM's OpenMP (apt-get install clang libomp-dev)",
)
# each build setup.py makes: the x86-64 level it needs, its flags and vector width
LEVELS = {"_vsn_kernels": (1, []), "_vsn_kernels_avx2": (3, ["-march=x86-64-v3", "-DVL=8"]),
          "_vsn_kernels_avx512": (4, ["-march=x86-64-v4", "-DVL=16"])}  # fmt: skip


def clang_build(tmp_path, name: str):
    """`name` built by clang (as the baseline module, the one a build of one's own replaces)."""
    module = tmp_path / "_vsn_kernels.so"
    made = build("clang", module, "-O3", "-Werror", *LEVELS[name][1])
    assert made.returncode == 0, made.stderr[-3000:]
    return module


@pytest.mark.slow  # a build (2 s) and a process that loads it
@needs_clang
def test_a_clang_build_beside_a_torch_on_gnus_openmp_is_refused_with_one_warning(tmp_path):
    if not any("gomp" in lib for lib in cpu_kernels.openmp_runtimes()):
        pytest.skip("this torch does not run GNU's OpenMP")
    module = clang_build(tmp_path, "_vsn_kernels")
    out, warnings = load_in_process(
        module, "from foxhunt.models import cpu_kernels as c; print(c.status().build)"
    )
    assert out.strip() == "None"
    assert len(warnings) == 1 and "another OpenMP runtime" in warnings[0], warnings
    assert "libomp" in warnings[0] and "CC=gcc" in warnings[0], warnings[0]


@pytest.mark.slow  # a build (2-4 s) and the kernel tests (about 10 s) per build
@needs_clang
@pytest.mark.parametrize("name", list(LEVELS))
def test_each_clang_build_passes_the_kernel_tests_on_one_openmp_runtime(tmp_path, name):
    level = cpu_kernels.load("_vsn_kernels").x86_level() if cpu_kernels.load("_vsn_kernels") else 1
    if LEVELS[name][0] > level:
        pytest.skip(f"{name} needs x86-64-v{LEVELS[name][0]}; this CPU is v{level}")
    run_kernel_tests(clang_build(tmp_path, name), LD_PRELOAD=LIBOMP)
