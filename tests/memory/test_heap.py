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

def faults_of_three_blocks():
    for _ in range(2):  # the heap grows to hold the block (its first two times, measured)
        x = torch.ones(16 << 20)  # 64 MiB: over glibc's largest mmap threshold (32 MiB)
        del x
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        x = torch.ones(16 << 20)
        del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = faults_of_three_blocks()
kept = keep_freed_memory()
print(json.dumps({"default": default, "kept": kept, "after": faults_of_three_blocks()}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_freed_block_comes_back_without_page_faults():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    pages = 3 * (64 << 20) // 4096
    assert result["default"] > pages / 2  # malloc's default maps each 64 MiB block afresh
    assert result["kept"] and result["after"] < pages / 20
