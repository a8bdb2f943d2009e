"""Benchmark foxhunt's TFT against pytorch-forecasting's, side by side in one process.

    python benchmarks/bench_tft.py --config S [--device cuda] [--skip-theirs] [--threads 2]
                                   [--lean]

Both models see the same synthetic data (`foxhunt.data.synthetic`) and shapes. Ours trains with
the step training runs (`foxhunt.training.step.train_step`), theirs with the same sequence:
zero the gradients, forward, the same quantile loss, backward, AdamW step. The timed loops
alternate (ours, theirs, ours, theirs, ...) so that drift of a shared machine (turbo, other
jobs) hits both alike. The output is a table, then, as the last line, one JSON object with the
raw figures; the peak memory breakdown names the parts as `foxhunt.memory.PARTS` does.

pytorch-forecasting is optional: `pip install -e ".[bench]"`, or pass --skip-theirs.

--lean skips what only adds detail: the FLOP count (it runs every op through FlopCounterMode on
the decomposed LSTM and attention, and does not depend on the device: count on a CPU) and, on
CUDA, MemTracker's breakdown of the peak (the allocator's peak stands). Config B's
pytorch-forecasting model runs a module per variable (225): under those two Python-level
trackers one step of it took longer than gpu_check's whole 55-70 s budget on an H200.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import Tensor, nn

from foxhunt.config import DataConfig
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.synthetic import synthetic_panel
from foxhunt.evaluation.loss import quantile_loss
from foxhunt.memory import MB, PARTS
from foxhunt.memory.table import breakdown_rows, format_table
from foxhunt.models import TemporalFusionTransformer
from foxhunt.threads import CpuShare
from foxhunt.threads import off as threads_off
from foxhunt.training.step import train_step, validation_forward

# pytorch-forecasting and Lightning warn about things that do not matter to a benchmark
# (nn.Module hyperparameters, dataloader workers, ...); keep stdout to the table and the JSON.
for _noisy in ("pytorch_forecasting", "lightning", "lightning_fabric", "pytorch_lightning"):
    warnings.filterwarnings("ignore", module=_noisy)
warnings.filterwarnings("ignore", message=".*TF32 acceleration on top of oneDNN.*")

QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)
BATCH_SIZE = 64
ENCODER_LENGTH = 64
PREDICTION_LENGTH = 8
NUM_SERIES = 4
SERIES_LENGTH = 3000
LEARNING_RATE = 1e-3
DROPOUT = 0.1
PARAM_TOLERANCE = 0.05  # the two models must be the same size to within this fraction
MIN_DATAMODULE_BATCHES = 200
MAX_BATCH_POOL = 64  # batches kept in memory for the timed loops; they are cycled


@dataclass(frozen=True)
class Shape:
    """One benchmark configuration; `encoder_vars` counts as pytorch-forecasting does."""

    encoder_vars: int  # target + (encoder_vars - 2) features + relative time index
    hidden: int
    heads: int
    lstm_layers: int
    continuous_hidden: int
    default_steps: int
    default_eval_batches: int

    @property
    def num_features(self) -> int:
        return self.encoder_vars - 2


CONFIGS = {
    "S": Shape(16, 64, 4, 1, 16, default_steps=20, default_eval_batches=20),
    "B": Shape(225, 256, 8, 2, 256, default_steps=2, default_eval_batches=1),
}


_STARTED = time.perf_counter()


def log(message: str) -> None:
    """Progress goes to stderr, so stdout stays the table and the JSON line; each line says the
    seconds since start, so that a run killed by a timeout shows where the time went."""
    print(f"[{time.perf_counter() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    """CUDA runs asynchronously: wait for queued work before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- data ----------------------------------------------------------------------------------


def make_frame(shape: Shape, seed: int = 0) -> dict[str, np.ndarray]:
    """NUM_SERIES series of SERIES_LENGTH steps: a unit-variance AR(1) target and unit-variance
    noise features, so that ours (which standardizes) and theirs (target_normalizer=None) see
    values of the same scale."""
    names = [f"s{s}" for s in range(NUM_SERIES)]
    return synthetic_panel(names, SERIES_LENGTH, shape.num_features, seed=seed)


def feature_names(frame: dict[str, np.ndarray]) -> list[str]:
    return [c for c in frame if c.startswith("f")]


def build_datamodule(
    frame: dict[str, np.ndarray], workdir: Path
) -> tuple[ParquetDataModule, float]:
    """Ours go through foxhunt's own Parquet pipeline; returns the module and its setup time."""
    path = workdir / "bench.parquet"
    pq.write_table(pa.table({k: pa.array(v) for k, v in frame.items()}), path)
    cfg = DataConfig(
        path=str(path),
        time_column="time",
        time_unit="ns",  # step numbers, not times: no calendar features are derived from them
        group_column="series",
        target="target",
        features=feature_names(frame),
        encoder_length=ENCODER_LENGTH,
        prediction_length=PREDICTION_LENGTH,
        val_fraction=0.1,
        test_fraction=0.1,
        batch_size=BATCH_SIZE,
    )
    datamodule = ParquetDataModule(cfg)
    start = time.perf_counter()
    datamodule.setup()
    return datamodule, time.perf_counter() - start


def datamodule_windows_per_s(datamodule: ParquetDataModule) -> float:
    """Windows/s of the train loader alone: whole passes until MIN_DATAMODULE_BATCHES."""
    windows = batches = 0
    start = time.perf_counter()
    while batches < MIN_DATAMODULE_BATCHES:
        for batch in datamodule.train_dataloader():
            windows += len(batch["target"])
            batches += 1
    return windows / (time.perf_counter() - start)


def pool_batches(
    make_loader: Callable[[], Iterable[Any]], size: Callable[[Any], int], count: int
) -> list[Any]:
    """`count` full batches, cycling the loader if one pass has fewer (a ragged last batch
    would make the per-step work uneven)."""
    pool: list[Any] = []
    while len(pool) < count:
        before = len(pool)
        for batch in make_loader():
            if size(batch) == BATCH_SIZE:
                pool.append(batch)
                if len(pool) == count:
                    break
        if len(pool) == before:
            raise RuntimeError("the loader yields no full batch")
    return pool


# --- the two contenders -------------------------------------------------------------------


@dataclass
class Contender:
    """A model, its optimizer and pre-collected device batches, plus the figures measured.

    `step` (one training step) and `evaluate` (one eval forward) hide the two batch formats:
    ours is a dict, theirs (x, y) with x pytorch-forecasting's input dict."""

    name: str
    module: nn.Module  # the eager model: parameters, FLOPs and memory are measured on it
    step: Callable[[nn.Module, torch.optim.Optimizer, Any], Tensor]
    evaluate: Callable[[nn.Module, Any], Tensor]
    tensors: Callable[[Any], list[Tensor]]
    batches: list[Any]
    model: nn.Module = field(init=False)  # what the timed loops call (compiled, maybe)
    optimizer: torch.optim.Optimizer = field(init=False)
    cursor: Iterator[Any] = field(init=False)
    train_runs: list[float] = field(default_factory=list)  # samples/s, one per repeat
    eval_runs: list[float] = field(default_factory=list)  # ms/batch, one per repeat
    figures: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model = self.module
        # plain AdamW for both (foxhunt's training uses the fused one: make_optimizer)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=LEARNING_RATE)
        self.cursor = itertools.cycle(self.batches)

    def train_step(self, model: nn.Module | None = None) -> Tensor:
        return self.step(self.model if model is None else model, self.optimizer, next(self.cursor))

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())


def _to(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def build_ours(
    shape: Shape, datamodule: ParquetDataModule, pool: int, device: torch.device
) -> Contender:
    torch.manual_seed(0)
    module = TemporalFusionTransformer(
        num_observed=shape.encoder_vars - 1,  # the target's history + the features
        num_known=0,  # the model appends the relative time index itself
        prediction_length=PREDICTION_LENGTH,
        hidden_dim=shape.hidden,
        num_heads=shape.heads,
        lstm_layers=shape.lstm_layers,
        dropout=DROPOUT,
        variable_dim=shape.continuous_hidden,
        quantiles=QUANTILES,
    ).to(device)
    batches = pool_batches(datamodule.train_dataloader, lambda b: len(b["target"]), pool)
    quantiles = torch.tensor(QUANTILES, device=device)
    return Contender(
        name="ours",
        module=module,
        step=lambda model, optimizer, batch: train_step(model, optimizer, batch, quantiles),
        evaluate=validation_forward,
        tensors=lambda batch: list(batch.values()),
        batches=[_to(b, device) for b in batches],
    )


def import_pytorch_forecasting() -> Any:
    """Lazy, so that --skip-theirs works without pytorch-forecasting installed."""
    try:
        import pytorch_forecasting
    except ImportError as exc:  # not installed, or one of its own imports fails
        print(f'pytorch-forecasting: {exc}; pip install -e ".[bench]"', file=sys.stderr)
        sys.exit(2)
    return pytorch_forecasting


def build_theirs(
    shape: Shape, frame: dict[str, np.ndarray], pool: int, device: torch.device
) -> Contender:
    import pandas as pd

    pf = import_pytorch_forecasting()
    from pytorch_forecasting.metrics import QuantileLoss

    features = feature_names(frame)
    dataset = pf.TimeSeriesDataSet(
        pd.DataFrame(frame),
        time_idx="time",
        target="target",
        group_ids=["series"],
        max_encoder_length=ENCODER_LENGTH,
        min_encoder_length=ENCODER_LENGTH,
        max_prediction_length=PREDICTION_LENGTH,
        min_prediction_length=PREDICTION_LENGTH,
        time_varying_unknown_reals=["target", *features],
        add_relative_time_idx=True,
        add_target_scales=False,
        add_encoder_length=False,
        target_normalizer=None,
    )
    torch.manual_seed(0)
    module = pf.TemporalFusionTransformer.from_dataset(
        dataset,
        hidden_size=shape.hidden,
        attention_head_size=shape.heads,
        lstm_layers=shape.lstm_layers,
        hidden_continuous_size=shape.continuous_hidden,
        dropout=DROPOUT,
        output_size=len(QUANTILES),
        loss=QuantileLoss(list(QUANTILES)),
    ).to(device)
    batches = pool_batches(
        lambda: dataset.to_dataloader(train=True, batch_size=BATCH_SIZE, num_workers=0),
        lambda b: len(b[1][0]),
        pool,
    )
    quantiles = torch.tensor(QUANTILES, device=device)
    return Contender(
        name="theirs",
        module=module,
        step=lambda model, optimizer, batch: their_train_step(model, optimizer, batch, quantiles),
        evaluate=lambda model, batch: model(batch[0])["prediction"],
        tensors=lambda batch: [*batch[0].values(), batch[1]],
        # (x, (y, weight)) -> (x, y): the weight is None here
        batches=[(_to(x, device), y[0].to(device)) for x, y in batches],
    )


def their_train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, quantiles: Tensor
) -> Tensor:
    """foxhunt.training.step.train_step for pytorch-forecasting's model (its output is a dict):
    zero the gradients, forward, the same quantile loss, backward, optimizer step."""
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = quantile_loss(model(x)["prediction"], y, quantiles)
    loss.backward()
    optimizer.step()
    return loss.detach()


# --- measurements ---------------------------------------------------------------------------


def gemm_gflops(device: torch.device, dtype: torch.dtype, seconds: float = 1.0) -> float:
    """Best of a few ~seconds/4 trials of a square matmul: the machine's practical peak."""
    n = 2048 if device.type == "cpu" else 8192  # big enough to saturate the chip
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(2):  # warm-up: thread pool, cuBLAS handle and heuristics
        torch.mm(a, b, out=out)
    sync(device)
    start = time.perf_counter()
    torch.mm(a, b, out=out)
    sync(device)
    trials = 4
    iters = max(1, int(seconds / trials / (time.perf_counter() - start)))
    best = 0.0
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, b, out=out)
        sync(device)
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - start))
    return best / 1e9


def count_gflop(c: Contender) -> float:
    """FLOPs of one training step's forward and backward (the first step: it also creates the
    optimizer state, whose update FlopCounterMode does not count).

    FlopCounterMode only sees ATen matmuls, so the step runs on the decomposed paths: oneDNN
    (CPU) and cuDNN (CUDA) LSTMs, and the fused SDPA kernels, would otherwise count as zero."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with ExitStack() as stack:
        stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
        stack.enter_context(torch.backends.cudnn.flags(enabled=False))
        stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        counter = stack.enter_context(FlopCounterMode(display=False))
        c.train_step(c.module)
    return counter.get_total_flops() / 1e9


def held_bytes(c: Contender, device: torch.device) -> int:
    """Bytes on `device` of what a contender holds between steps and MemTracker counts for it:
    parameters, buffers, gradients, optimizer state and its first batch."""
    params = list(c.module.parameters())
    tensors = [*params, *c.module.buffers(), *(p.grad for p in params if p.grad is not None)]
    tensors += [t for s in c.optimizer.state.values() for t in s.values() if isinstance(t, Tensor)]
    tensors += c.tensors(c.batches[0])
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in tensors
        if t.device.type == device.type
    }
    return sum(storages.values())


def peak_memory(
    c: Contender, device: torch.device, breakdown_on_cuda: bool = True
) -> tuple[float, dict[str, float] | None]:
    """Peak MiB of one training step once the optimizer state exists, and its breakdown by
    part (foxhunt.memory.PARTS; on CUDA only with `breakdown_on_cuda`).

    MemTracker attributes every live tensor (parameters, gradients, optimizer state,
    activations saved for backward, temporaries); on CUDA the allocator's own peak, less what
    the other contender holds, is the total and MemTracker, where it works, only adds the
    breakdown."""
    from torch.distributed._tools.mem_tracker import MemTracker

    breakdown: dict[str, float] | None = None
    total: float | None = None
    if device.type == "cuda":
        sync(device)
        # the allocator counts both contenders (and cuBLAS's workspaces): leave out what is
        # not this contender's, as MemTracker does
        others = torch.cuda.memory_allocated(device) - held_bytes(c, device)
        torch.cuda.reset_peak_memory_stats(device)
        c.train_step(c.module)
        sync(device)
        total = (torch.cuda.max_memory_allocated(device) - others) / MB
        if not breakdown_on_cuda:
            return total, None
    try:
        tracker = MemTracker()
        tracker.track_external(c.module, c.optimizer, *c.tensors(c.batches[0]))
        with tracker:
            c.train_step(c.module)
        snapshot = tracker.get_tracker_snapshot("peak")
        per_device = snapshot.get(device, snapshot.get(torch.device(device.type, 0), {}))
        mib = {getattr(k, "value", str(k)): v / MB for k, v in per_device.items()}
        breakdown = {part: mib.get(key, 0.0) for key, part in PARTS.items()}
        if total is None:
            total = mib["Total"]
    except Exception as exc:  # a breakdown is a bonus; the CUDA total stands
        if total is None:
            raise
        log(f"MemTracker failed on {device.type} ({type(exc).__name__}: {exc}); no breakdown")
    return total, breakdown


# on a CPU, the threads a foxhunt training would use between batches (foxhunt.threads; None
# with FOXHUNT_THREADS=off or OMP_NUM_THREADS set): both contenders' loops follow it alike
SHARE: CpuShare | None = None


def between_batches() -> None:
    if SHARE is not None:
        SHARE.update()


def time_training(c: Contender, warmup: int, steps: int, device: torch.device) -> float:
    """Training samples/s of a plain loop over pre-collected batches, after warm-up steps."""
    c.model.train()
    for _ in range(warmup):
        c.train_step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        between_batches()
        c.train_step()
    sync(device)
    return steps * BATCH_SIZE / (time.perf_counter() - start)


def time_eval(c: Contender, batches: int, device: torch.device) -> float:
    """Mean eval forward ms per batch after one warm-up batch."""
    c.model.eval()
    try:
        with torch.no_grad():
            c.evaluate(c.model, next(c.cursor))
            sync(device)
            start = time.perf_counter()
            for _ in range(batches):
                between_batches()
                c.evaluate(c.model, next(c.cursor))
            sync(device)
            return (time.perf_counter() - start) * 1000 / batches
    finally:
        c.model.train()


def try_compile(c: Contender) -> str | None:
    """torch.compile ours; on failure (no compiler, graph break errors) stay eager and say why.

    The first compiled step runs here, so compilation never lands in a timed loop."""
    try:
        c.model = torch.compile(c.module)
        c.train_step()
        return None
    except Exception as exc:  # any compile failure is reported, not fatal
        c.model = c.module
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


# --- report ---------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(c: Contender, gemm: float) -> dict[str, Any]:
    f = c.figures
    train = statistics.median(c.train_runs)
    gflop = f["gflop_per_step"]  # None with --lean
    achieved = None if gflop is None else gflop * train / BATCH_SIZE  # GFLOP/step x steps/s
    return {
        "params": c.params,
        "train_samples_per_s": train,
        "train_samples_per_s_runs": c.train_runs,
        "eval_ms_per_batch": statistics.median(c.eval_runs),
        "eval_ms_per_batch_runs": c.eval_runs,
        "peak_mib": f["peak_mib"],
        "peak_breakdown_mib": f["peak_breakdown_mib"],
        "gflop_per_step": f["gflop_per_step"],
        "achieved_gflops": achieved,
        "gemm_fraction": None if achieved is None else achieved / gemm,
    }


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_table(result: dict[str, Any]) -> None:
    ours, theirs = result["ours"], result["theirs"] or {}
    g = result["gemm_gflops"]
    rows: list[list[str]] = []

    def row(label: str, key: str, fmt: str, ratio: float | None = None, meaning: str = "") -> None:
        cells = [_cell(ours.get(key), fmt), _cell(theirs.get(key), fmt), _cell(ratio, ".3f")]
        rows.append([label, *cells, meaning if ratio is not None else ""])

    row("parameters", "params", ",d", result["param_ratio"], "ours/theirs")
    row("train samples/s", "train_samples_per_s", ".1f", result["train_speedup"], "speedup")
    row("eval ms/batch", "eval_ms_per_batch", ".2f", result["eval_speedup"], "speedup")
    row("peak train-step MiB", "peak_mib", ".1f", result["memory_ratio"], "ours/theirs")
    parts = [ours["peak_breakdown_mib"], theirs.get("peak_breakdown_mib")]
    if ours["peak_breakdown_mib"] is not None:  # --lean on CUDA: no breakdown
        rows += [[*r, "", ""] for r in breakdown_rows(parts, indent="  ")]
    for label, key in (
        ("GFLOP/step (fwd+bwd)", "gflop_per_step"),
        ("achieved GFLOP/s", "achieved_gflops"),
        ("fraction of matmul rate", "gemm_fraction"),
    ):
        fmt = ".3f" if key == "gemm_fraction" else ".2f"
        row(label, key, fmt, _ratio(ours.get(key), theirs.get(key)), "ours/theirs")

    print(
        f"TFT benchmark: config {result['config']}, device {result['device']}, "
        f"torch {result['torch']}, {result['threads']} threads; median of {result['repeats']} "
        f"repeats of {result['steps']} steps (batch {BATCH_SIZE}), "
        f"{result['eval_batches']} eval batches"
    )
    gemm_line = f"matmul fp32: {g:.1f} GFLOP/s"
    if result.get("gemm_bf16_gflops"):
        gemm_line += f", bf16: {result['gemm_bf16_gflops']:.1f} GFLOP/s"
    print(gemm_line)
    if result["compile"]:
        print(f"ours compiled: {result['compile_error'] or 'yes'} (memory and FLOPs: eager)")
    print(format_table(["", "ours", "theirs", "ratio", ""], rows, align="lrrrl"))
    print(
        f"DataModule train loader: {result['datamodule_windows_per_s']:.0f} windows/s = "
        f"{result['datamodule_vs_train']:.1f}x ours' training samples/s "
        f"(setup {result['datamodule_setup_s']:.2f} s)"
    )
    cores, load = result["cpu_count"] or 1, max(result["load_avg"])
    if load > cores:
        print(
            f"NOTE: load average {load:.1f} on {cores} cores: other work shared the CPU, so "
            "the figures are noisy (oversubscribed OpenMP threads slow down a lot: try --threads 1)"
        )
    if result["param_warning"]:
        print(result["param_warning"])


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=sorted(CONFIGS), required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before each timing")
    p.add_argument("--steps", type=int, help="timed training steps per repeat (S 20, B 2)")
    p.add_argument("--eval-batches", type=int, help="timed eval batches per repeat (S 20, B 1)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip-theirs", action="store_true", help="only ours; ratios are null")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: as is)")
    p.add_argument("--compile", action="store_true", help="wrap ours in torch.compile")
    p.add_argument(
        "--lean",
        action="store_true",
        help="skip the FLOP count and, on CUDA, the peak's breakdown (the allocator's peak stays)",
    )
    args = p.parse_args(argv)
    shape = CONFIGS[args.config]
    args.steps = shape.default_steps if args.steps is None else args.steps
    args.eval_batches = (
        shape.default_eval_batches if args.eval_batches is None else args.eval_batches
    )
    if min(args.steps, args.eval_batches, args.repeats) < 1 or args.warmup < 0:
        p.error("--steps, --eval-batches and --repeats must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available", file=sys.stderr)
        sys.exit(2)
    if not args.skip_theirs:
        import_pytorch_forecasting()  # fail fast, before minutes of work
    global SHARE
    if args.threads:
        torch.set_num_threads(args.threads)
    elif args.device == "cpu" and not threads_off():
        SHARE = CpuShare()
    device = torch.device(args.device)
    shape = CONFIGS[args.config]
    pool = min(max(args.warmup + args.steps, args.eval_batches + 1), MAX_BATCH_POOL)

    load_start = os.getloadavg()[0]
    log(f"building data and models for config {args.config} ...")
    frame = make_frame(shape)
    with tempfile.TemporaryDirectory() as tmp:
        datamodule, setup_s = build_datamodule(frame, Path(tmp))  # setup() reads it all
    contenders = [build_ours(shape, datamodule, pool, device)]
    if not args.skip_theirs:
        log("theirs: TimeSeriesDataSet and model ...")
        contenders.append(build_theirs(shape, frame, pool, device))

    log("matmul rates and the DataModule's rate ...")
    gemm = gemm_gflops(device, torch.float32)
    gemm_bf16 = gemm_gflops(device, torch.bfloat16) if device.type == "cuda" else None
    dm_rate = datamodule_windows_per_s(datamodule)

    compile_error: str | None = None
    for c in contenders:
        if args.lean:
            log(f"{c.name}: first step (AdamW's state) ...")
            c.train_step(c.module)
            c.figures["gflop_per_step"] = None
        else:
            log(f"{c.name}: FLOP count (also the step creating AdamW's state) ...")
            c.figures["gflop_per_step"] = count_gflop(c)
        tracker = "allocator" if args.lean and device.type == "cuda" else "MemTracker"
        log(f"{c.name}: peak memory ({tracker}) ...")
        c.figures["peak_mib"], c.figures["peak_breakdown_mib"] = peak_memory(
            c, device, breakdown_on_cuda=not args.lean
        )
        if args.compile and c.name == "ours":
            compile_error = try_compile(c)
            if compile_error:
                print(f"WARNING: torch.compile failed, ours runs eagerly: {compile_error}")

    # Alternate so that machine drift (other jobs, clocks) spreads over both alike.
    for r in range(args.repeats):
        for c in contenders:
            log(f"repeat {r + 1}/{args.repeats}: {c.name} ...")
            c.train_runs.append(time_training(c, args.warmup, args.steps, device))
            c.eval_runs.append(time_eval(c, args.eval_batches, device))

    ours = summarize(contenders[0], gemm)
    theirs = summarize(contenders[1], gemm) if len(contenders) > 1 else None
    param_ratio = _ratio(ours["params"], theirs["params"]) if theirs else None
    param_warning = None
    if param_ratio is not None and abs(param_ratio - 1) > PARAM_TOLERANCE:
        param_warning = (
            f"WARNING: parameter counts differ by more than {PARAM_TOLERANCE:.0%}: "
            f"ours {ours['params']:,} vs theirs {theirs['params']:,}; the comparison is unfair"
        )
    result: dict[str, Any] = {
        "config": args.config,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        # 1-min load average at start and end: above cpu_count, other work shared the CPU
        "load_avg": [load_start, os.getloadavg()[0]],
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "eval_batches": args.eval_batches,
        "compile": args.compile,
        "compile_error": compile_error,
        "lean": args.lean,
        "param_ratio": param_ratio,
        "param_warning": param_warning,
        "train_speedup": _ratio(
            ours["train_samples_per_s"], theirs and theirs["train_samples_per_s"]
        ),
        "eval_speedup": _ratio(theirs and theirs["eval_ms_per_batch"], ours["eval_ms_per_batch"]),
        "memory_ratio": _ratio(ours["peak_mib"], theirs and theirs["peak_mib"]),
        "gemm_gflops": gemm,
        "gemm_bf16_gflops": gemm_bf16,
        "datamodule_windows_per_s": dm_rate,
        "datamodule_setup_s": setup_s,
        "datamodule_vs_train": dm_rate / ours["train_samples_per_s"],
        "ours": ours,
        "theirs": theirs,
    }
    print_table(result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
