"""Builds of the C kernels of one's own (a compiler, its flags) and the kernel tests run on one
of them in a fresh process (`cpu_kernels.CUSTOM`): the sanitizer and the clang tests' steps."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from foxhunt.models import cpu_kernels

ROOT = Path(__file__).resolve().parents[2]
KERNEL_TESTS = ["test_kernel_ops.py", "test_cpu_kernels.py", "test_kernel_fuzz.py"]


def library_of(compiler: str, name: str) -> str | None:
    """The path of `compiler`'s runtime library `name` (libasan.so, libomp.so.5), or None."""
    if shutil.which(compiler) is None:
        return None
    found = subprocess.run(
        [compiler, f"-print-file-name={name}"], capture_output=True, text=True
    ).stdout.strip()
    return found if os.path.isabs(found) and os.path.isfile(found) else None


def build(
    compiler: str, out: Path, *flags: str, sources: Path = ROOT / "src/foxhunt/models"
) -> subprocess.CompletedProcess:
    """_vsn_kernels.c of `sources` built by `compiler` with `flags` into `out`, stamped as
    setup.py stamps a build (the sha256 of those sources: the loader refuses any other)."""
    stamp = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(sources.glob("_vsn_*.c"))))
    return subprocess.run(
        [compiler, *flags, "-fopenmp", "-shared", "-fPIC",
         f"-I{sysconfig.get_paths()['include']}", f'-DKERNELS_SOURCE="{stamp.hexdigest()}"',
         str(sources / "_vsn_kernels.c"), "-o", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip


def run_kernel_tests(module: Path, **env: str) -> str:
    """The kernel tests' output, run in a fresh process on the build `module`, with `env`
    added to the environment; AssertionError where they fail."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly",
         "-p", "no:cacheprovider", *(str(ROOT / "tests/models" / t) for t in KERNEL_TESTS)],
        cwd=ROOT, env=os.environ | {cpu_kernels.CUSTOM: str(module)} | env,
        capture_output=True, text=True,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]
    assert " passed" in out and "the C kernels are not built here" not in out, out[-5000:]
    return out


def load_in_process(module: Path, probe: str) -> tuple[str, list[str]]:
    """Python code `probe` run in a fresh process on the build `module`: its stdout, and the
    kernels' warnings ("CPU kernels do not run: ...") among its stderr's lines."""
    run = subprocess.run(
        [sys.executable, "-c", probe], env=os.environ | {cpu_kernels.CUSTOM: str(module)},
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout, [
        line for line in run.stderr.splitlines() if "CPU kernels do not run" in line
    ]
