#!/usr/bin/env bash
# The GPU check (#18) on a lent GPU machine, as one command:
#     bash benchmarks/gpu_check.sh [options of python -m benchmarks.gpu_check]    (carry: .whl)
# The machine's image lacks Hydra, OmegaConf, ANTLR and pytorch-forecasting: they travel as
# wheels in .whl (git-ignored; how to make it: below) and are installed into /tmp/site.
# Output: $OUT/gpu_check.log (everything printed), $OUT/gpu_check.json (written after every
# section), $OUT/seed_train.log; $OUT defaults to outputs/gpu_check.
# Time: --budget-s (default 520, the plan's sum) for the sections together, each with a share
# (TIME_PLAN_S in benchmarks/gpu_check/runner.py) that scales with it; --section-budget
# NAME=SECONDS sets one.
# With the wheels' install and the imports, the command takes at most about 9 minutes (a device
# command may run 10); the machine's start comes on top. Two shorter commands: --sections
# env,estimator,seed then --sections with the bench_* ones.
# Making .whl (once, on a machine with PyPI; the versions are those pyproject.toml resolves to):
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform any -d .whl hydra-core==1.3.8 omegaconf==2.3.1 pytorch-forecasting==1.8.0 \
#       "scikit-base<1.1.0"
#   pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3      # PyPI has no wheel of it
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-outputs/gpu_check}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
# pytorch-forecasting's wheel also installs top-level docs/, examples/ and tests/ packages: the
# last would shadow this repository's tests package
rm -rf /tmp/site/docs /tmp/site/examples /tmp/site/extension_templates /tmp/site/tests
export PYTHONPATH="/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 -u -m benchmarks.gpu_check --out "$out" "$@" 2>&1 | tee "$out/gpu_check.log"
