"""The C kernels built with AddressSanitizer and UndefinedBehaviorSanitizer run the kernel tests
(ops, fixed cases, drawn cases): an out-of-bounds access, a use after free or undefined
behaviour aborts the run (full tier, Linux with GCC's sanitizers)."""

from __future__ import annotations

import sys

import pytest

from tests.models.kernel_builds import build, library_of, run_kernel_tests


@pytest.mark.slow  # a build (4 s) and the kernel tests under the sanitizers (about 25 s)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernels are Linux only")
def test_the_kernel_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    runtimes = [library_of("gcc", "libasan.so"), library_of("gcc", "libubsan.so")]
    if None in runtimes:
        pytest.skip("no gcc with its sanitizer runtimes (apt-get install gcc)")
    module = tmp_path / "_vsn_kernels.so"
    made = build(
        "gcc", module, "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    out = run_kernel_tests(
        module,
        LD_PRELOAD=":".join(runtimes),
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",  # (Python's own allocations leak)
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
    )
    assert "Sanitizer" not in out and "runtime error" not in out, out[-5000:]
