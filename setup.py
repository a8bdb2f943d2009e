"""foxhunt's one C extension, the CPU kernels (src/foxhunt/models/_vsn_kernels.c, its Python
module _vsn_module.c); everything else is in pyproject.toml.

Built three times: for any CPU, and for x86-64 CPUs with AVX2 and with AVX-512, each with the
vector width of its registers (`foxhunt.models.cpu_kernels` loads the widest this CPU runs).
Each build is stamped with the sha256 of the sources (`SOURCE`), which the loader compares with
the sources beside an editable install: a build older than its source is not run.

Optional: where no C compiler with OpenMP is found, or it cannot target a build's CPU level
(-march=x86-64-v3/v4 needs GCC 11 or clang 12), pip installs foxhunt without what failed, says
so in one line, and the kernels' callers run their PyTorch paths; a run's summary says which
(`foxhunt.models.cpu_kernels.status`). clang builds them on LLVM's OpenMP runtime, which a torch
on GNU's (PyPI's wheels) refuses at load: build with GCC there (tests/models/test_clang.py).
Linux only: elsewhere the compilers at hand differ in OpenMP support, and the kernels are
measured on Linux alone.
"""

import hashlib
import platform
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent / "src" / "foxhunt" / "models"
SOURCES = sorted(HERE.glob("_vsn_*.c"))
STAMP = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()
FLAGS = ["-O3", "-fopenmp"]
BUILDS = {"": []}  # module suffix: its -march
if platform.machine() in ("x86_64", "AMD64"):
    BUILDS |= {"_avx2": ["-march=x86-64-v3"], "_avx512": ["-march=x86-64-v4"]}


class OptionalBuild(build_ext):
    """Each kernel build that fails is left out with one line saying which and why, printed
    (pip shows it with -v) and kept beside the package as `<build>.not-built`, whose line the
    run's warning then says (`foxhunt.models.cpu_kernels.status`)."""

    def build_extension(self, ext: Extension) -> None:
        note = Path(self.get_ext_fullpath(ext.name)).with_name(
            ext.name.rpartition(".")[2] + ".not-built"
        )
        note.unlink(missing_ok=True)
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 (a compiler's error, whatever its type)
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            line = (
                f"the compiler failed ({reason}; needs gcc >= 11 or clang >= 12 with OpenMP)"
            )
            print(f"foxhunt: the CPU kernels {ext.name} were not built: {line}", file=sys.stderr)
            note.parent.mkdir(parents=True, exist_ok=True)
            note.write_text(line + "\n")


kernels = [
    Extension(
        f"foxhunt.models._vsn_kernels{suffix}",
        [f"src/foxhunt/models/_vsn_kernels{suffix}.c"],
        depends=[str(p.relative_to(Path(__file__).parent)) for p in SOURCES],
        define_macros=[("KERNELS_SOURCE", f'"{STAMP}"')],
        extra_compile_args=FLAGS + march,
        extra_link_args=["-fopenmp"],
    )
    for suffix, march in BUILDS.items()
]
setup(
    ext_modules=kernels if sys.platform.startswith("linux") else [],
    cmdclass={"build_ext": OptionalBuild},
)
