"""foxhunt's one C extension, the fused variable selection's CPU kernels
(src/foxhunt/models/_vsn_kernels.c); everything else is in pyproject.toml.

Built three times: for any CPU, and for x86-64 CPUs with AVX2 and with AVX-512, each with the
vector width of its registers (`foxhunt.models.cpu_kernels.library` loads the widest this CPU
runs). Optional: where no C compiler (or no OpenMP, or no x86-64) is found, pip installs
foxhunt without what failed and the selection runs its PyTorch path
(`foxhunt.models.cpu_kernels.available`). Linux only: elsewhere the compilers at hand differ in
OpenMP support, and the kernels are measured on Linux alone.
"""

import platform
import sys

from setuptools import Extension, setup

FLAGS = ["-O3", "-fopenmp"]
BUILDS = {"": []}  # module suffix: its -march
if platform.machine() in ("x86_64", "AMD64"):
    BUILDS |= {"_avx2": ["-march=x86-64-v3"], "_avx512": ["-march=x86-64-v4"]}

kernels = [
    Extension(
        f"foxhunt.models._vsn_kernels{suffix}",
        [f"src/foxhunt/models/_vsn_kernels{suffix}.c"],
        depends=["src/foxhunt/models/_vsn_kernels.c"],
        extra_compile_args=FLAGS + march,
        extra_link_args=["-fopenmp"],
        optional=True,
    )
    for suffix, march in BUILDS.items()
]
setup(ext_modules=kernels if sys.platform.startswith("linux") else [])
