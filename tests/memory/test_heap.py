"""foxhunt.memory.heap: after it, a freed block is served again without faulting its pages in
(in a process of its own: the setting is the process's)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from tests.helpers import ROOT

PROBE = """
import json, resource, torch
from foxhunt.memory.heap import keep_freed_memory

def faults_per_block(times):
    out = []
    for _ in range(times):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x = torch.ones(16 << 20)  # 64 MiB: over glibc's largest mmap threshold (32 MiB)
        del x
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return out

default = faults_per_block(4)
kept = keep_freed_memory()
print(json.dumps({"default": default, "kept": kept, "after": faults_per_block(32)}))
"""


@pytest.mark.slow  # 6 CPU-s: the full tier
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_freed_block_comes_back_without_page_faults():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    pages = (64 << 20) // 4096  # of one block
    # malloc's default maps each 64 MiB block afresh; kept, the heap grows to hold the block a
    # few times (1 to 7 in 100 processes, measured: it depends on the address layout) and then
    # serves it without a fault
    assert min(result["default"][1:]) > pages / 2, result
    assert result["kept"] and max(result["after"][-8:]) < pages / 20, result
