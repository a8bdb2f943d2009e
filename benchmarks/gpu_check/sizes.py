"""The check's sizes: FULL, the whole check on a GPU, and QUICK, a dry run (--quick)."""

from __future__ import annotations

from dataclasses import dataclass

# the DLE configuration's timing on a GPU: 20 steps of batch 1,024 a repeat
DLE = ("--config", "DLE", "--lean", "--steps", "20", "--eval-batches", "5", "--warmup", "3")


@dataclass(frozen=True)
class Sizes:
    """What a run of the check does: the full check on a GPU, or a quick dry run."""

    estimator_cases: tuple[tuple[str, str, int], ...]  # model, precision, batch size
    warmup: int  # untimed training steps before the measured ones
    steps: int  # measured training steps
    seed_overrides: tuple[str, ...]  # scripts/train.py's, besides the scenario's own
    vsn: tuple[int, int, int, int, int, int]  # variables, variable_dim, hidden, context, B, T
    vsn_repeats: int
    bench_args: dict[str, tuple[str, ...]]  # bench_tft.py's options by section; absent: not run


FULL = Sizes(
    # tft_base first: the seed scenario's model, and what matters if time runs short; tft_small
    # at one size (its small batches are the allocator's segments more than the step)
    estimator_cases=(
        *(("tft_base", p, b) for p in ("fp32", "bf16") for b in (32, 128, 512)),
        ("tft_small", "fp32", 512),
        ("tft_small", "bf16", 512),
    ),
    warmup=2,
    steps=3,
    seed_overrides=(
        "model=tft_base",
        "data.ohlcv.num_features=225",
        # one epoch, cut: ~20 s of training on an H200 after a ~75 s batch-size search
        "trainer.limit_train_batches=60",
        "trainer.limit_val_batches=10",
        "trainer.limit_test_batches=10",
    ),
    vsn=(227, 64, 256, 256, 32, 64),  # tft_base's encoder selection: 225 features, target, time
    vsn_repeats=3,
    # B: FlopCounterMode and MemTracker over pytorch-forecasting's 225 per-variable modules
    # outlasted 55-70 s budgets on an H200: --lean (the FLOP count does not depend on the
    # device; the allocator's peak stands). DLE: NVIDIA's published configuration, TF32 and
    # bf16 against pytorch-forecasting, then ours compiled (inductor, then CUDA graphs) alone:
    # the measurement model.compile=auto's CUDA default waits for
    bench_args={
        "DLE": DLE + ("--precision", "tf32"),
        "DLE_bf16": DLE + ("--precision", "bf16"),
        "DLE_compiled": DLE + ("--precision", "bf16", "--skip-theirs", "--compile"),
        "DLE_graphs": DLE
        + ("--precision", "bf16", "--skip-theirs", "--compile")
        + ("--compile-mode", "reduce-overhead"),
        "B": ("--config", "B", "--lean"),
        "S": ("--config", "S"),
    },
)
QUICK = Sizes(
    # both models and both precisions once (tft_base's bf16 step alone takes 16 s on a CPU)
    estimator_cases=(("tft_base", "fp32", 2), ("tft_small", "bf16", 4)),
    warmup=1,
    steps=1,
    seed_overrides=(
        "model=tft_small",
        "memory.batch_size_search.max_batch_size=32",
        "memory.batch_size_search.max_trials=4",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
    ),
    vsn=(7, 4, 8, 8, 3, 5),
    vsn_repeats=1,
    # B: 77M parameters, a TFLOP a step; minutes on a CPU, GPU only. S with --lean, the
    # option B runs with on the GPU
    bench_args={
        "S": ("--config", "S", "--steps", "1", "--eval-batches", "1", "--repeats", "1")
        + ("--warmup", "0", "--lean")
    },
)
