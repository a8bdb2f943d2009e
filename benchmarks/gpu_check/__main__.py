"""`python -m benchmarks.gpu_check [options]`, from the repository root: see the package's
docstring, or --help."""

import sys

try:  # Hydra: the GPU machine has it only once gpu_check.sh has installed the carried wheels
    from benchmarks.gpu_check.runner import main
except ModuleNotFoundError as exc:
    print(f"gpu_check: no module {exc.name!r}: run benchmarks/gpu_check.sh", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    main()
