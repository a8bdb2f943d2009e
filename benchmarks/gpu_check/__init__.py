"""The GPU check (#18): foxhunt's CUDA paths measured in one command, within minutes.

    bash benchmarks/gpu_check.sh                     # on the GPU machine: wheels, then this
    python -m benchmarks.gpu_check [--device cuda|cpu] [--quick] [--out DIR] [--budget-s 520]
                                   [--section-budget NAME=SECONDS ...] [--sections a,b,...]

from the repository root. A module a section (env, fused_vsn, budget, estimator with
estimator_report, seed with the training run's probe, bench), run by runner (the time plan,
the closing table, the options); common: what several sections measure with.

Sections, in this order; one that fails records its error and the next one runs:
  env        the device, driver, versions, and the memory the CUDA context takes
  fused_vsn  the fused variable selection (forward_scalars) against the plain path, forward and
             backward, float64 / float32 / bf16 autocast, and both paths' time and memory
  budget     device_budget's cap (set_per_process_memory_fraction on CUDA) met by allocations
  estimator  foxhunt.memory.estimate against max_memory_allocated / max_memory_reserved of real
             steps (foxhunt.training.step, after warm-up steps) for tft_base (225 features) and
             tft_small, fp32 and bf16; every case starts from a freed allocator and its peaks
             are read net of what was allocated before it (the cuBLAS/cuDNN workspaces,
             recorded apart); fits memory.cuda_reserve_fraction and memory.cuda_context_mb
  seed       scripts/train.py memory=gpu_4gb model=tft_base data.ohlcv.num_features=225, one
             epoch cut by trainer.limit_*_batches: exit status, the searched batch sizes, OOM
             backoffs, the allocator's peaks, each phase's time, and whether the peak reserved
             plus the CUDA context fits a real 4 GB card
  bench_*    benchmarks/bench_tft.py against pytorch-forecasting (--skip-theirs when it is not
             installed): DLE (NVIDIA's TFT configuration: hidden 128, encoder 168, decoder 24,
             batch 1,024) in TF32 and in bf16, then ours alone compiled (inductor) and with
             CUDA graphs (reduce-overhead), which model.compile=auto's CUDA default waits for;
             config B; config S. All --lean but S: no FLOP count, no MemTracker breakdown
After every section the results so far go to OUT/gpu_check.json; each section prints a table,
and the last line of the output is one JSON object with every figure.

Time plan: each section has a share of --budget-s (runner.TIME_PLAN_S, 520 s in all; scaled when
--budget-s differs, or --sections picks some; --section-budget sets one share in seconds and
the others share the rest). Time a section leaves unspent rolls forward to the next ones (the
last, bench_S, gets what is left); a section whose budget falls under its minimum is skipped.

--device cpu runs the same code paths on a CPU (CUDA-only figures are null): with --quick, tiny
sizes and steps, a dry run of the whole check in a few minutes.
"""
