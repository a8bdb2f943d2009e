"""foxhunt's benchmarks. Each bench_*.py runs as a script (`python benchmarks/bench_tft.py`);
the package lets the GPU check import them: `python -m benchmarks.gpu_check` from the
repository root."""
