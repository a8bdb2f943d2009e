"""A build of the kernels from older sources than those beside it (an editable install after an
edit to the C file) is refused, not called (full tier: a gcc build)."""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.models.kernel_builds import ROOT, build, load_in_process


@pytest.mark.slow  # a build (3 s) and a process that loads it
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernels are Linux only")
def test_a_build_from_older_sources_is_refused_and_the_pytorch_path_runs(tmp_path):
    older = tmp_path / "older"
    shutil.copytree(ROOT / "src/foxhunt/models", older, ignore=shutil.ignore_patterns("*.so"))
    kernels = older / "_vsn_kernels.c"  # the C file as it was before an edit
    kernels.write_text("/* before the edit */\n" + kernels.read_text())
    module = tmp_path / "_vsn_kernels.so"
    made = build("gcc", module, "-O1", sources=older)
    assert made.returncode == 0, made.stderr[-3000:]
    probe = (
        "import torch; from foxhunt.models import cpu_kernels as c, dropout; "
        "x = torch.ones(4096); y = dropout.Dropout(0.5).train()(x); "
        "print(c.status().build, sum(c.CALLS.values()), int((y == 0).sum()) > 0)"
    )
    out, warnings = load_in_process(module, probe)
    assert out.split() == ["None", "0", "True"]  # refused, never called, PyTorch ran
    assert len(warnings) == 1 and "built from other sources" in warnings[0], warnings
