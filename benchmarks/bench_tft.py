"""Benchmark foxhunt's TFT against pytorch-forecasting's (and Darts'), side by side in one process.

    python benchmarks/bench_tft.py --config S|B|DLE [--device cuda] [--precision fp32|tf32|bf16]
                                   [--theirs pf|darts|pf,darts|none] [--threads 2] [--lean]
                                   [--compile [--compile-mode reduce-overhead]]

The models see the same synthetic data (`foxhunt.data.samples.synthetic`) and shapes. Ours trains
with the step training runs (`foxhunt.training.step.train_step`), theirs with the same sequence:
zero the gradients, forward, the same quantile loss (Darts: its own QuantileRegression),
backward, AdamW step. The timed loops alternate (ours, theirs, ours, theirs, ...) so that drift
of a shared machine (turbo, other jobs) hits all alike. The output is a table, then, as the last
line, one JSON object with the raw figures; the peak memory breakdown names the parts as
`foxhunt.memory.PARTS` does.

Configs: S (16 variables, hidden 64) and B (225 variables, hidden 256) are foxhunt's own; DLE is
NVIDIA DeepLearningExamples' TFT on electricity (hidden 128, 4 heads, encoder 168, decoder 24,
3 quantiles, batch 1024): one target, three known covariates (hour, day of week, hours from
start) and a static id of 369 series, every input embedded at the hidden size. Its published
training rates (their README, 22.11 container): 12,435 items/s TF32 and 17,608 AMP on one
A100-80GB. One item is one window, a training sample here.

pytorch-forecasting and Darts are optional: `pip install -e ".[bench]"` (Darts: its `u8darts`
core, Darts' TFTModel with `skip_interpolation=True`), or `--theirs none`. A contender that does
not import is left out with one line saying why.

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import Tensor, nn

from foxhunt.config import DataConfig
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.samples.synthetic import synthetic_panel
from foxhunt.evaluation.loss import quantile_loss
from foxhunt.memory import MB, PARTS
from foxhunt.memory.heap import keep_freed_memory
from foxhunt.memory.table import breakdown_rows, format_table
from foxhunt.models import TemporalFusionTransformer, cpu_kernels
from foxhunt.threads import CpuShare
from foxhunt.threads import off as threads_off
from foxhunt.training.step import train_step, validation_forward

# pytorch-forecasting and Lightning warn about things that do not matter to a benchmark
# (nn.Module hyperparameters, dataloader workers, ...); keep stdout to the table and the JSON.
for _noisy in ("pytorch_forecasting", "lightning", "lightning_fabric", "pytorch_lightning"):
    warnings.filterwarnings("ignore", module=_noisy)
warnings.filterwarnings("ignore", message=".*TF32 acceleration on top of oneDNN.*")

QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)
LEARNING_RATE = 1e-3
DROPOUT = 0.1
PARAM_TOLERANCE = 0.05  # the two models must be the same size to within this fraction
MIN_DATAMODULE_BATCHES = 200
MAX_BATCH_POOL = 64  # batches kept in memory for the timed loops; they are cycled


@dataclass(frozen=True)
class Shape:
    """One benchmark configuration. The encoder selects among the target, `features` observed
    reals, `known` known reals and the relative time index; the decoder among the known ones and
    the relative time index; `static_id`: the series' id is a static categorical."""

    features: int
    hidden: int
    heads: int
    lstm_layers: int
    continuous_hidden: int  # each variable's embedding (pytorch-forecasting's name)
    default_steps: int
    default_eval_batches: int
    batch_size: int = 64
    encoder_length: int = 64
    prediction_length: int = 8
    quantiles: tuple[float, ...] = QUANTILES
    known: int = 0
    static_id: bool = False
    series: int = 4
    series_length: int = 3000


CONFIGS = {
    "S": Shape(14, 64, 4, 1, 16, default_steps=20, default_eval_batches=20),
    "B": Shape(223, 256, 8, 2, 256, default_steps=2, default_eval_batches=1),
    "DLE": Shape(
        0,
        128,
        4,
        1,
        128,
        default_steps=2,
        default_eval_batches=2,
        batch_size=1024,
        encoder_length=168,
        prediction_length=24,
        quantiles=(0.1, 0.5, 0.9),
        known=3,
        static_id=True,
        series=369,
        series_length=600,
    ),
}
KNOWN = ("hour", "day_of_week", "hours_from_start")  # DLE's electricity inputs, as many as used


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
    """`shape.series` series of `series_length` steps: a unit-variance target and unit-variance
    noise features, so that ours (which standardizes) and theirs (target_normalizer=None) see
    values of the same scale. With known covariates (DLE), the target is electricity-like, a
    daily and weekly load profile per series plus AR(1) noise, beside its calendar inputs."""
    names = [f"s{s}" for s in range(shape.series)]
    frame = synthetic_panel(names, shape.series_length, shape.features, seed=seed)
    if shape.known:
        hours = frame["time"].astype(np.float64)
        rng = np.random.default_rng(seed + 1)
        level = np.repeat(rng.uniform(0.5, 1.5, shape.series), shape.series_length)
        profile = np.sin(2 * np.pi * hours / 24) + 0.5 * np.sin(2 * np.pi * hours / 168)
        target = level * profile + 0.3 * frame["target"]
        frame["target"] = ((target - target.mean()) / target.std()).astype(np.float32)
        calendar = {
            "hour": (hours % 24) / 23 - 0.5,
            "day_of_week": (hours // 24 % 7) / 6 - 0.5,
            "hours_from_start": hours / shape.series_length - 0.5,
        }
        frame |= {k: calendar[k].astype(np.float32) for k in KNOWN[: shape.known]}
    if shape.static_id:
        frame["series_id"] = np.repeat(np.arange(shape.series), shape.series_length)
    return frame


def feature_names(frame: dict[str, np.ndarray]) -> list[str]:
    return [c for c in frame if c.startswith("f")]


def known_names(frame: dict[str, np.ndarray]) -> list[str]:
    return [c for c in KNOWN if c in frame]


def build_datamodule(
    shape: Shape, frame: dict[str, np.ndarray], workdir: Path
) -> tuple[ParquetDataModule, float]:
    """Ours go through foxhunt's own Parquet pipeline; returns the module and its setup time.
    The series are its groups, so that their index is the static id (`static_cat`)."""
    path = workdir / "bench.parquet"
    columns = {k: v for k, v in frame.items() if k != "series_id"}
    pq.write_table(pa.table({k: pa.array(v) for k, v in columns.items()}), path)
    cfg = DataConfig(
        path=str(path),
        time_column="time",
        time_unit="ns",  # step numbers, not times: no calendar features are derived from them
        group_column="series",
        target="target",
        features=feature_names(frame),
        known_features=known_names(frame),
        encoder_length=shape.encoder_length,
        prediction_length=shape.prediction_length,
        val_fraction=0.1,
        test_fraction=0.1,
        calibration_share=0.0,  # a speed bench: every validation window validates
        batch_size=shape.batch_size,
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
    make_loader: Callable[[], Iterable[Any]], size: Callable[[Any], int], count: int, full: int
) -> list[Any]:
    """`count` full batches, cycling the loader if one pass has fewer (a ragged last batch
    would make the per-step work uneven)."""
    pool: list[Any] = []
    while len(pool) < count:
        before = len(pool)
        for batch in make_loader():
            if size(batch) == full:
                pool.append(batch)
                if len(pool) == count:
                    break
        if len(pool) == before:
            raise RuntimeError("the loader yields no full batch")
    return pool


# --- the contenders -------------------------------------------------------------------------


@dataclass
class Contender:
    """A model, its optimizer and pre-collected device batches, plus the figures measured.

    `step` (one training step) and `evaluate` (one eval forward) hide the batch formats: ours
    is a dict, pytorch-forecasting's (x, y) with x its input dict, Darts' its tuple. Both run
    under `autocast` (bf16) when set."""

    name: str  # ours, theirs (pytorch-forecasting) or darts
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
    autocast: torch.dtype | None = None  # bf16: the steps run under torch.autocast

    def __post_init__(self) -> None:
        self.model = self.module
        # plain AdamW for all (foxhunt's training uses the fused one: make_optimizer)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=LEARNING_RATE)
        self.cursor = itertools.cycle(self.batches)

    def _precision(self) -> Any:
        device = next(self.module.parameters()).device.type
        return torch.autocast(device, dtype=self.autocast, enabled=self.autocast is not None)

    def train_step(self, model: nn.Module | None = None) -> Tensor:
        with self._precision():
            return self.step(
                self.model if model is None else model, self.optimizer, next(self.cursor)
            )

    def eval_step(self) -> Tensor:
        with self._precision():
            return self.evaluate(self.model, next(self.cursor))

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
        num_observed=1 + shape.features,  # the target's history + the features
        num_known=shape.known,  # the model appends the relative time index itself
        prediction_length=shape.prediction_length,
        static_cardinalities=(shape.series,) if shape.static_id else (),
        hidden_dim=shape.hidden,
        num_heads=shape.heads,
        lstm_layers=shape.lstm_layers,
        dropout=DROPOUT,
        variable_dim=shape.continuous_hidden,
        quantiles=shape.quantiles,
        highway=False,  # the TFT of Lim et al., as the contenders build it
        monotone=False,
        highway_first=False,
    ).to(device)
    batches = pool_batches(
        datamodule.train_dataloader, lambda b: len(b["target"]), pool, shape.batch_size
    )
    quantiles = torch.tensor(shape.quantiles, device=device)
    return Contender(
        name="ours",
        module=module,
        step=lambda model, optimizer, batch: train_step(model, optimizer, batch, quantiles),
        evaluate=validation_forward,
        tensors=lambda batch: list(batch.values()),
        batches=[_to(b, device) for b in batches],
    )


def build_theirs(
    shape: Shape, frame: dict[str, np.ndarray], pool: int, device: torch.device
) -> Contender:
    # imported here, so that --theirs none runs without them (main checked that they import)
    import pandas as pd
    import pytorch_forecasting as pf
    from pytorch_forecasting.metrics import QuantileLoss

    features, known = feature_names(frame), known_names(frame)
    static = ["series"] if shape.static_id else []
    dataset = pf.TimeSeriesDataSet(
        pd.DataFrame({k: v for k, v in frame.items() if k != "series_id"}),
        time_idx="time",
        target="target",
        group_ids=["series"],
        max_encoder_length=shape.encoder_length,
        min_encoder_length=shape.encoder_length,
        max_prediction_length=shape.prediction_length,
        min_prediction_length=shape.prediction_length,
        static_categoricals=static,
        time_varying_known_reals=known,
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
        output_size=len(shape.quantiles),
        loss=QuantileLoss(list(shape.quantiles)),
        # the static id embedded as wide as ours (and DLE's) embed every input
        embedding_sizes={k: (shape.series, shape.continuous_hidden) for k in static},
    ).to(device)
    batches = pool_batches(
        lambda: dataset.to_dataloader(train=True, batch_size=shape.batch_size, num_workers=0),
        lambda b: len(b[1][0]),
        pool,
        shape.batch_size,
    )
    quantiles = torch.tensor(shape.quantiles, device=device)
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


def build_darts(
    shape: Shape, frame: dict[str, np.ndarray], pool: int, device: torch.device
) -> Contender:
    """Darts' TFTModel (`skip_interpolation=True`, its fast path since reports that its
    interpolation took 90% of the time) on the same frame: the features as past covariates, the
    known reals as future covariates, the id as a categorical static covariate, and Darts'
    relative index as ours and pytorch-forecasting's. Its Lightning module is stepped by hand,
    as the others: Darts' own batches (its training dataset and collate), forward and its
    QuantileRegression loss, backward, AdamW."""
    import pandas as pd
    from darts import TimeSeries
    from darts.models import TFTModel
    from darts.utils.likelihood_models import QuantileRegression

    features, known = feature_names(frame), known_names(frame)
    length = shape.series_length

    def series_of(columns: list[str], i: int) -> TimeSeries | None:
        rows = slice(i * length, (i + 1) * length)
        if not columns:
            return None
        return TimeSeries.from_values(np.stack([frame[c][rows] for c in columns], axis=1))

    targets, past, future = [], [], []
    for i in range(shape.series):
        target = series_of(["target"], i)
        if shape.static_id:
            target = target.with_static_covariates(pd.DataFrame({"series_id": [i]}))
        targets.append(target)
        past.append(series_of(features, i))
        future.append(series_of(known, i))
    model = TFTModel(
        input_chunk_length=shape.encoder_length,
        output_chunk_length=shape.prediction_length,
        hidden_size=shape.hidden,
        lstm_layers=shape.lstm_layers,
        num_attention_heads=shape.heads,
        hidden_continuous_size=shape.continuous_hidden,
        dropout=DROPOUT,
        batch_size=shape.batch_size,
        add_relative_index=True,
        categorical_embedding_sizes=(
            {"series_id": (shape.series, shape.continuous_hidden)} if shape.static_id else None
        ),
        likelihood=QuantileRegression(list(shape.quantiles)),
        skip_interpolation=True,
        random_state=0,
        pl_trainer_kwargs={"accelerator": device.type, "logger": False},
    )
    dataset = model._build_train_dataset(  # Darts' own windows, as its fit() makes them
        series=targets,
        past_covariates=past if features else None,
        future_covariates=future if known else None,
        sample_weight=None,
        max_samples_per_ts=None,
    )
    torch.manual_seed(0)
    _, module, loader, _, _ = model._setup_for_train(dataset)  # builds the module
    module = module.to(device)

    def move(batch: tuple) -> tuple:
        return tuple(None if t is None else t.to(device) for t in batch)

    batches = pool_batches(lambda: loader, lambda b: len(b[0]), pool, shape.batch_size)
    return Contender(
        name="darts",
        module=module,
        step=darts_train_step,
        # (past target, past cov, historic future cov, future cov, static cov) -> its output
        evaluate=lambda model, batch: model._produce_train_output(batch[:5]),
        tensors=lambda batch: [t for t in batch if t is not None],
        batches=[move(b) for b in batches],
    )


def darts_train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> Tensor:
    """Darts' training step without Lightning's loop: its forward on the batch's inputs, its
    likelihood's loss against the future target, backward, optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    output = model._produce_train_output(batch[:5])
    loss = model._compute_loss(output, batch[-1], model.train_criterion, None)
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
    (CPU) and cuDNN (CUDA) LSTMs, the fused SDPA kernels and foxhunt's C kernels (whose
    matmuls, row by row at S, and recomputed in backward) would otherwise count as zero."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with ExitStack() as stack:
        stack.enter_context(cpu_kernels.off())
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


def time_training(
    c: Contender, warmup: int, steps: int, batch_size: int, device: torch.device
) -> float:
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
    return steps * batch_size / (time.perf_counter() - start)


def time_eval(c: Contender, batches: int, device: torch.device) -> float:
    """Mean eval forward ms per batch after one warm-up batch."""
    c.model.eval()
    try:
        with torch.no_grad():
            c.eval_step()
            sync(device)
            start = time.perf_counter()
            for _ in range(batches):
                between_batches()
                c.eval_step()
            sync(device)
            return (time.perf_counter() - start) * 1000 / batches
    finally:
        c.model.train()


def try_compile(c: Contender, mode: str | None) -> str | None:
    """torch.compile ours (`mode`: inductor's, e.g. reduce-overhead for CUDA graphs); on failure
    (no compiler, graph break errors) stay eager and say why.

    The first compiled steps run here, so compilation never lands in a timed loop: training and
    evaluation each compile their own graph."""
    try:
        c.model = torch.compile(c.module, mode=mode)
        for _ in range(2):  # CUDA graphs record on a later call than the first
            c.train_step()
        c.model.eval()
        with torch.no_grad():
            for _ in range(2):
                c.eval_step()
        c.model.train()
        return None
    except Exception as exc:  # any compile failure is reported, not fatal
        c.model = c.module
        c.model.train()
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


# --- report ---------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(c: Contender, gemm: float, batch_size: int) -> dict[str, Any]:
    f = c.figures
    train = statistics.median(c.train_runs)
    gflop = f["gflop_per_step"]  # None with --lean
    achieved = None if gflop is None else gflop * train / batch_size  # GFLOP/step x steps/s
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


def comparison(ours: dict[str, Any], theirs: dict[str, Any] | None) -> dict[str, float | None]:
    """Ours against one contender: speedups (> 1: ours faster) and ratios (ours / theirs)."""
    if theirs is None:
        return dict.fromkeys(("param_ratio", "train_speedup", "eval_speedup", "memory_ratio"))
    return {
        "param_ratio": _ratio(ours["params"], theirs["params"]),
        "train_speedup": _ratio(ours["train_samples_per_s"], theirs["train_samples_per_s"]),
        "eval_speedup": _ratio(theirs["eval_ms_per_batch"], ours["eval_ms_per_batch"]),
        "memory_ratio": _ratio(ours["peak_mib"], theirs["peak_mib"]),
    }


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_table(result: dict[str, Any]) -> None:
    names = ["ours", *(n for n in ("theirs", "darts") if result[n] is not None)]
    figures = [result[n] for n in names]
    versus = [result if n == "theirs" else result["vs_darts"] for n in names[1:]]
    g = result["gemm_gflops"]
    rows: list[list[str]] = []

    def row(label: str, key: str, fmt: str, ratio_key: str | None = None) -> None:
        cells = [_cell(f.get(key), fmt) for f in figures]
        if ratio_key is None:  # ours / theirs of the figure itself
            ratios = [_ratio(figures[0].get(key), f.get(key)) for f in figures[1:]]
        else:
            ratios = [v[ratio_key] for v in versus]
        rows.append([label, *cells, *(_cell(r, ".3f") for r in ratios)])

    row("parameters", "params", ",d", "param_ratio")
    row("train samples/s", "train_samples_per_s", ".1f", "train_speedup")
    row("eval ms/batch", "eval_ms_per_batch", ".2f", "eval_speedup")
    row("peak train-step MiB", "peak_mib", ".1f", "memory_ratio")
    parts = [f["peak_breakdown_mib"] for f in figures]
    if parts[0] is not None:  # --lean on CUDA: no breakdown
        blank = [""] * (len(names) - 1)
        rows += [[*r, *blank] for r in breakdown_rows(parts, indent="  ")]
    for label, key in (
        ("GFLOP/step (fwd+bwd)", "gflop_per_step"),
        ("achieved GFLOP/s", "achieved_gflops"),
        ("fraction of matmul rate", "gemm_fraction"),
    ):
        row(label, key, ".3f" if key == "gemm_fraction" else ".2f")

    print(
        f"TFT benchmark: config {result['config']}, device {result['device']} "
        f"({result['device_name']}), {result['precision']}, torch {result['torch']}, "
        f"{result['threads']} threads; median of {result['repeats']} repeats of "
        f"{result['steps']} steps (batch {result['batch_size']}), {result['eval_batches']} "
        "eval batches"
    )
    kept = "kept mapped (foxhunt.memory.heap)" if result["heap_kept"] else "malloc's default"
    print(f"freed host memory: {kept}, for all contenders alike")
    gemm_line = f"matmul fp32: {g:.1f} GFLOP/s"
    if result.get("gemm_bf16_gflops"):
        gemm_line += f", bf16: {result['gemm_bf16_gflops']:.1f} GFLOP/s"
    print(gemm_line)
    if result["compile"]:
        print(f"ours compiled: {result['compile_error'] or 'yes'} (memory and FLOPs: eager)")
    for name in ("theirs", "darts"):
        if result.get(f"{name}_error"):
            print(f"{name}: left out ({result[f'{name}_error']})")
    labels = {"ours": "ours", "theirs": "pytorch-forecasting", "darts": "darts"}
    header = ["", *(labels[n] for n in names), *(f"vs {labels[n]}" for n in names[1:])]
    print(format_table(header, rows, align="l" + "r" * (2 * len(names) - 1)))
    print("(vs: speedup for samples/s and ms/batch, ours/theirs for the rest)")
    if result["datamodule_windows_per_s"] is not None:
        print(
            f"DataModule train loader: {result['datamodule_windows_per_s']:.0f} windows/s = "
            f"{result['datamodule_vs_train']:.1f}x ours' training samples/s "
            f"(setup {result['datamodule_setup_s']:.2f} s)"
        )
    if result["config"] == "DLE" and result["device"] == "cuda":
        print(
            "NVIDIA's TFT at this shape (their README): 12,435 items/s TF32 and 17,608 AMP on one "
            "A100-80GB; 5,932 / 10,163 on a V100-16GB"
        )
    cores, load = result["cpu_count"] or 1, max(result["load_avg"])
    if load > cores:
        print(
            f"NOTE: load average {load:.1f} on {cores} cores: other work shared the CPU, so "
            "the figures are noisy (oversubscribed OpenMP threads slow down a lot: try --threads 1)"
        )
    for warning in result["param_warnings"]:
        print(warning)


# --- main -----------------------------------------------------------------------------------

THEIRS = {"pf": "theirs", "darts": "darts"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=sorted(CONFIGS), required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--precision",
        choices=("fp32", "tf32", "bf16"),
        default="fp32",
        help="tf32: float32 with TF32 matmuls (CUDA); bf16: torch.autocast bfloat16 for all",
    )
    p.add_argument("--batch-size", type=int, help="instead of the config's (S and B 64, DLE 1024)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before each timing")
    p.add_argument("--steps", type=int, help="timed training steps per repeat (S 20, B 2, DLE 2)")
    p.add_argument("--eval-batches", type=int, help="timed eval batches per repeat (S 20, B 1)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--theirs",
        default="pf",
        help="contenders beside ours, comma-separated: pf (pytorch-forecasting), darts; none",
    )
    p.add_argument("--skip-theirs", action="store_true", help="the same as --theirs none")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: as is)")
    p.add_argument(
        "--malloc-default",
        action="store_true",
        help="leave glibc's malloc as it is (foxhunt's training keeps freed memory mapped)",
    )
    p.add_argument("--compile", action="store_true", help="wrap ours in torch.compile")
    p.add_argument(
        "--no-kernels",
        action="store_true",
        help="ours without foxhunt's C kernels (eager, or compiled: torch.compile's own code)",
    )
    p.add_argument(
        "--compile-mode", help="torch.compile's mode (reduce-overhead: CUDA graphs on CUDA)"
    )
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
    if min(args.steps, args.eval_batches, args.repeats, args.batch_size or 1) < 1:
        p.error("--steps, --eval-batches, --repeats and --batch-size must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    args.shape = replace(shape, batch_size=args.batch_size or shape.batch_size)
    theirs = [] if args.skip_theirs else [t for t in args.theirs.split(",") if t != "none"]
    if set(theirs) - set(THEIRS):
        p.error(f"--theirs takes pf, darts or none, got {args.theirs!r}")
    args.theirs = [THEIRS[t] for t in THEIRS if t in theirs]
    return args


def importable(name: str) -> str | None:
    """Why contender `name` cannot run here (its library does not import), or None."""
    module = {"theirs": "pytorch_forecasting", "darts": "darts.models"}[name]
    try:
        __import__(module)
    except Exception as exc:  # not installed, or one of its own imports fails
        return f'{module}: {type(exc).__name__}: {exc}; pip install -e ".[bench]"'
    return None


def set_precision(precision: str) -> torch.dtype | None:
    """TF32 matmuls for tf32 (CUDA; plain float32 elsewhere), the autocast dtype for bf16 (on a
    CPU without oneDNN bfloat16 our LSTMs run in float32 under it, as foxhunt's bf16 does)."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    return torch.bfloat16 if precision == "bf16" else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    with ExitStack() as stack:
        if args.no_kernels:
            stack.enter_context(cpu_kernels.off())
        return run(args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The bench as `args` ask: builds, measures, prints the table and the JSON line."""
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available", file=sys.stderr)
        sys.exit(2)
    missing = {name: importable(name) for name in args.theirs}
    if missing.get("theirs"):  # asked for by name: fail fast, before minutes of work
        print(f"pytorch-forecasting: {missing['theirs']}", file=sys.stderr)
        sys.exit(2)
    # foxhunt's training keeps freed memory mapped (foxhunt.memory.heap); in this one process
    # it serves every contender alike, so the ratios do not count it (--malloc-default: off)
    heap_kept = not args.malloc_default and keep_freed_memory()
    global SHARE
    if args.threads:
        torch.set_num_threads(args.threads)
    elif args.device == "cpu" and not threads_off():
        SHARE = CpuShare()
    device = torch.device(args.device)
    autocast = set_precision(args.precision)
    shape = args.shape
    pool = min(max(args.warmup + args.steps, args.eval_batches + 1), MAX_BATCH_POOL)

    load_start = os.getloadavg()[0]
    log(f"building data and models for config {args.config} ...")
    frame = make_frame(shape)
    with tempfile.TemporaryDirectory() as tmp:
        datamodule, setup_s = build_datamodule(shape, frame, Path(tmp))  # setup() reads it all
    contenders = [build_ours(shape, datamodule, pool, device)]
    builders = {"theirs": build_theirs, "darts": build_darts}
    errors: dict[str, str | None] = dict.fromkeys(("theirs", "darts"))
    for name in args.theirs:
        if missing[name]:
            errors[name] = missing[name]
            log(f"{name}: left out: {missing[name]}")
            continue
        log(f"{name}: its dataset and model ...")
        contenders.append(builders[name](shape, frame, pool, device))
    for c in contenders:
        c.autocast = autocast

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
            log("ours: compiling (the first steps) ...")
            compile_error = try_compile(c, args.compile_mode)
            if compile_error:
                print(f"WARNING: torch.compile failed, ours runs eagerly: {compile_error}")

    # Alternate so that machine drift (other jobs, clocks) spreads over all alike.
    for r in range(args.repeats):
        for c in contenders:
            log(f"repeat {r + 1}/{args.repeats}: {c.name} ...")
            c.train_runs.append(time_training(c, args.warmup, args.steps, shape.batch_size, device))
            c.eval_runs.append(time_eval(c, args.eval_batches, device))

    figures = {c.name: summarize(c, gemm, shape.batch_size) for c in contenders}
    ours = figures["ours"]
    theirs, darts = figures.get("theirs"), figures.get("darts")
    param_warnings = [
        f"WARNING: parameter counts differ by more than {PARAM_TOLERANCE:.0%}: ours "
        f"{ours['params']:,} vs {name} {other['params']:,}; the comparison is unfair"
        for name, other in (("pytorch-forecasting", theirs), ("darts", darts))
        if other is not None and abs(ours["params"] / other["params"] - 1) > PARAM_TOLERANCE
    ]
    result: dict[str, Any] = {
        "config": args.config,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": args.precision,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        # 1-min load average at start and end: above cpu_count, other work shared the CPU
        "load_avg": [load_start, os.getloadavg()[0]],
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "eval_batches": args.eval_batches,
        "batch_size": shape.batch_size,
        "heap_kept": heap_kept,
        "compile": args.compile,
        "compile_mode": args.compile_mode,
        "compile_error": compile_error,
        "kernels": not args.no_kernels,
        "lean": args.lean,
        **comparison(ours, theirs),  # against pytorch-forecasting, as before Darts came
        "param_warnings": param_warnings,
        "vs_darts": comparison(ours, darts),
        "gemm_gflops": gemm,
        "gemm_bf16_gflops": gemm_bf16,
        "datamodule_windows_per_s": dm_rate,
        "datamodule_setup_s": setup_s,
        "datamodule_vs_train": dm_rate / ours["train_samples_per_s"],
        "ours": ours,
        "theirs": theirs,
        "darts": darts,
        "theirs_error": errors["theirs"],
        "darts_error": errors["darts"],
    }
    print_table(result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
