"""foxhunt's one C extension, the fused variable selection's CPU kernels
(src/foxhunt/models/_vsn_kernels.c); everything else is in pyproject.toml.

Optional: where no C compiler (or no OpenMP) is found, pip installs foxhunt without it and the
selection runs its PyTorch path (`foxhunt.models.cpu_kernels.available`). Linux only: elsewhere
the compilers at hand differ in OpenMP support, and the kernels are measured on Linux alone.
"""

import sys

from setuptools import Extension, setup

kernels = Extension(
    "foxhunt.models._vsn_kernels",
    ["src/foxhunt/models/_vsn_kernels.c"],
    extra_compile_args=["-O3", "-fopenmp"],
    extra_link_args=["-fopenmp"],
    optional=True,
)
setup(ext_modules=[kernels] if sys.platform.startswith("linux") else [])
