"""The C kernels built with AddressSanitizer and UndefinedBehaviorSanitizer run the kernel tests
(ops, fixed cases, drawn cases): an out-of-bounds access, a use after free or undefined
behaviour aborts the run (full tier, Linux with GCC's sanitizers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from foxhunt.models import cpu_kernels

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["test_kernel_ops.py", "test_cpu_kernels.py", "test_kernel_fuzz.py"]


def _runtime(name: str) -> str | None:
    """The path of GCC's sanitizer runtime `name` (libasan.so), or None without it."""
    if shutil.which("gcc") is None:
        return None
    found = subprocess.run(
        ["gcc", f"-print-file-name={name}"], capture_output=True, text=True
    ).stdout.strip()
    return found if os.path.isabs(found) and os.path.isfile(found) else None


@pytest.mark.slow  # a build (4 s) and the kernel tests under the sanitizers (about 25 s)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernels are Linux only")
def test_the_kernel_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    runtimes = [_runtime("libasan.so"), _runtime("libubsan.so")]
    if None in runtimes:
        pytest.skip("no gcc with its sanitizer runtimes (apt-get install gcc)")
    module = tmp_path / "_vsn_kernels.so"
    build = subprocess.run(
        ["gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all", "-fopenmp", "-shared", "-fPIC",
         f"-I{sysconfig.get_paths()['include']}",
         f'-DKERNELS_SOURCE="{cpu_kernels.source_stamp()}"',
         str(ROOT / "src/foxhunt/models/_vsn_kernels.c"), "-o", str(module)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    env = os.environ | {
        cpu_kernels.CUSTOM: str(module),
        "LD_PRELOAD": ":".join(runtimes),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",  # (Python's own allocations leak)
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly",
         "-p", "no:cacheprovider", *(str(ROOT / "tests/models" / t) for t in TESTS)],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]
    assert "Sanitizer" not in out and "runtime error" not in out, out[-5000:]
    assert " passed" in out and "the C kernels are not built here" not in out
