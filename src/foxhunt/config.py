"""Structured config schemas (one dataclass per Hydra group) and the semantic checks run after
composition, before any data is read."""

from __future__ import annotations

import importlib.util
import itertools
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from foxhunt.errors import ConfigError


@dataclass
class OhlcvConfig:
    """Raw bar column names and the derived feature families (see `foxhunt.data.features`)."""

    open: str = "open"
    high: str = "high"
    low: str = "low"
    close: str = "close"
    volume: str = "volume"
    return_lags: list[int] = field(default_factory=lambda: [2, 4, 8, 16, 32, 64])
    volatility_windows: list[int] = field(default_factory=lambda: [6, 12, 24, 48, 96])
    volume_windows: list[int] = field(default_factory=lambda: [12, 48, 96])
    range_windows: list[int] = field(default_factory=lambda: [1, 12])
    location_windows: list[int] = field(default_factory=lambda: [1, 12])
    momentum_windows: list[int] = field(default_factory=list)
    calendar: bool = True
    # Total number of derived features; families are extended on a grid to reach it (225 = seed).
    num_features: int | None = None


@dataclass
class DataConfig:
    path: str = MISSING
    time_column: str = "timestamp"
    # s | ms | us | ns: the unit of an integer time column (required for one; a Parquet
    # timestamp column carries its own unit)
    time_unit: str | None = None
    group_column: str | None = None
    # None with features=ohlcv: the 1-bar log return of the close, predicted for the next bars.
    target: str | None = None
    target_kind: str = "auto"  # auto | return | level (naive baseline: zero return / last value)
    features: Any = "all"  # "all" | "ohlcv" | [column, ...]
    known_features: list[str] = field(default_factory=list)
    static_features: list[str] = field(default_factory=list)
    ohlcv: OhlcvConfig = field(default_factory=OhlcvConfig)
    encoder_length: int = 64
    prediction_length: int = 8
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    batch_size: int = 64
    num_workers: int = 0
    nan_policy: str = "error"  # error | ffill | drop
    generate_if_missing: bool = False  # the bundled sample is generated on first use
    # auto | true | false: read one instrument at a time into a disk-backed window store
    # (foxhunt.data.store); auto when the in-memory path would need over half the free memory
    lazy: Any = "auto"
    cache_dir: str | None = None  # the window store's folder; None: .foxhunt-cache by the data


@dataclass
class ModelConfig:
    name: str = "tft_small"
    hidden_dim: int = 64
    num_heads: int = 4
    lstm_layers: int = 1
    dropout: float = 0.1
    variable_dim: int = 16  # width of each variable's own network (pf: hidden_continuous_size)
    quantiles: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9])
    # torch.compile the model (inductor); not part of the architecture, so resume may toggle it
    compile: bool = False


@dataclass
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 1e-2
    schedule: str = "cosine"  # cosine (linear warm-up then cosine) | onecycle | none
    warmup_fraction: float = 0.05
    # the schedule's length in epochs; None: trainer.max_epochs. Set it to stop early and
    # resume later on the same schedule (train 2 of 4 epochs, resume to 4 = 4 straight).
    schedule_epochs: int | None = None


@dataclass
class PrecisionConfig:
    name: str = "fp32"  # fp32 | bf16 | int8
    trainer_precision: str = "32-true"  # Lightning's precision flag
    backend: str = "torch.ao"  # int8: the quantization-aware training backend
    qat_start_epoch: int = 0  # int8: train in float before this epoch, fake-quantized from it
    observer_epochs: int = 1  # int8: epochs from qat_start_epoch during which ranges are observed


@dataclass
class TrainerConfig:
    max_epochs: int = 3
    accelerator: str = "auto"
    devices: Any = "auto"  # with strategy=ddp: processes per node (trainer=ddp trainer.devices=N)
    strategy: str = "auto"  # auto | ddp (conf/trainer/ddp.yaml) | another Lightning strategy name
    gradient_clip_val: float | None = 1.0
    log_every_n_steps: int = 50
    limit_train_batches: Any = None  # None = all batches (Lightning's default)
    limit_val_batches: Any = None  # None = all batches (Lightning's default)
    limit_test_batches: Any = None  # None = all batches (Lightning's default)
    enable_progress_bar: bool = True
    enable_model_summary: bool = True
    deterministic: bool = False


@dataclass
class LoggerConfig:
    name: str = "csv"  # csv | tensorboard


@dataclass
class CallbacksConfig:
    monitor: str = "val_loss"
    save_top_k: int = 1
    early_stopping_patience: int | None = None


@dataclass
class BatchSizeSearchConfig:
    enabled: bool = False
    max_batch_size: int = 4096
    max_trials: int = 12  # real trial steps at most (the estimator seeds the first)


@dataclass
class OomBackoffConfig:
    enabled: bool = True
    factor: float = 2.0  # the batch is split into micro-batches this many times smaller
    min_batch_size: int = 1
    max_retries: int = 8  # backoffs per run before giving up
    # accumulate the micro-batches' gradients into one step (the same update as the whole
    # batch); false: one optimizer step per micro-batch
    keep_effective_batch: bool = True


@dataclass
class MemoryConfig:
    """Memory policy (conf/memory/): the budget a run plans for, what it does to stay inside it,
    and the estimator's constants."""

    name: str = "default"
    budget_mb: float | None = None  # act as if the device had only this much; None = all of it
    safety_margin_mb: float = 256.0  # kept free of the budget
    val_batch_size: Any = None  # a number, null (= the training batch size) or auto (searched)
    device: str = "auto"  # auto | cpu | cuda: the device to plan for
    batch_size_search: BatchSizeSearchConfig = field(default_factory=BatchSizeSearchConfig)
    oom_backoff: OomBackoffConfig = field(default_factory=OomBackoffConfig)
    release_optimizer_state: bool = False  # move it off the device during validation
    clear_cache_every_n_batches: int = 0  # validation batches; 0 = never
    clear_cache_in_training: bool = False  # also every n training batches
    gradient_checkpointing: bool = False  # recompute the LSTM and attention in backward
    log_memory: bool = True  # [MEMORY] lines and memory metrics at each phase
    # CUDA, planned from the trace: the caching allocator reserves more than it hands out, and
    # the context (kernels, cuBLAS/cuDNN handles) sits outside both. Not yet checked on a GPU.
    cuda_reserve_fraction: float = 0.1
    cuda_context_mb: float = 500.0


@dataclass
class TrainConfig:
    data: DataConfig = MISSING
    model: ModelConfig = MISSING
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    callbacks: CallbacksConfig = MISSING
    memory: MemoryConfig = MISSING
    seed: int = 42
    ckpt_path: str | None = None
    resume: str | None = None  # auto | auto_or_new: the newest last.ckpt of this experiment
    optimized_metric: str = "val_loss"  # what train.py returns to a Hydra sweeper
    report: bool = True  # report.md, interpretation.json and plots in the run directory


def register_configs() -> None:
    """Register the schemas so each group's YAML is type-checked at composition."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: Any) -> None:
    """Semantic checks that types alone cannot express; raises ConfigError naming the key."""
    m, d, o = cfg.model, cfg.data, cfg.optim
    _check(m.hidden_dim > 0, f"model.hidden_dim must be positive, got {m.hidden_dim}")
    _check(m.num_heads > 0, f"model.num_heads must be positive, got {m.num_heads}")
    _check(
        m.hidden_dim % m.num_heads == 0,
        f"model.hidden_dim={m.hidden_dim} is not divisible by model.num_heads={m.num_heads}",
    )
    _check(m.lstm_layers > 0, f"model.lstm_layers must be positive, got {m.lstm_layers}")
    _check(m.variable_dim > 0, f"model.variable_dim must be positive, got {m.variable_dim}")
    _check(0 <= m.dropout < 1, f"model.dropout must be in [0, 1), got {m.dropout}")
    q = list(m.quantiles)
    _check(
        len(q) > 0 and all(0 < x < 1 for x in q) and all(a < b for a, b in itertools.pairwise(q)),
        f"model.quantiles must be strictly increasing values in (0, 1), got {q}",
    )
    _check(d.encoder_length > 0, f"data.encoder_length must be positive, got {d.encoder_length}")
    _check(
        d.prediction_length > 0,
        f"data.prediction_length must be positive, got {d.prediction_length}",
    )
    _check(d.batch_size > 0, f"data.batch_size must be positive, got {d.batch_size}")
    _check(
        o.schedule_epochs is None or o.schedule_epochs > 0,
        f"optim.schedule_epochs must be positive or null, got {o.schedule_epochs}",
    )
    _check(d.num_workers >= 0, f"data.num_workers must be >= 0, got {d.num_workers}")
    _check(
        0 <= d.val_fraction < 1
        and 0 <= d.test_fraction < 1
        and d.val_fraction + d.test_fraction < 1,
        "data.val_fraction and data.test_fraction must be in [0, 1) and sum to less than 1, "
        f"got {d.val_fraction} and {d.test_fraction}",
    )
    _check(
        d.nan_policy in ("error", "ffill", "drop"),
        f"data.nan_policy must be error, ffill or drop, got {d.nan_policy!r}",
    )
    _check(
        d.time_unit in (None, "s", "ms", "us", "ns"),
        f"data.time_unit must be s, ms, us, ns or null, got {d.time_unit!r}",
    )
    _check(
        d.target_kind in ("auto", "return", "level"),
        f"data.target_kind must be auto, return or level, got {d.target_kind!r}",
    )
    features = d.features
    _check(
        features in ("all", "ohlcv") or (not isinstance(features, str) and len(features) > 0),
        f"data.features must be 'all', 'ohlcv' or a list of columns, got {features!r}",
    )
    _check(
        features == "ohlcv" or d.target is not None,
        "data.target is required unless data.features=ohlcv",
    )
    _check(
        o.schedule in ("cosine", "onecycle", "none"),
        f"optim.schedule must be cosine, onecycle or none, got {o.schedule!r}",
    )
    _check(o.lr > 0, f"optim.lr must be positive, got {o.lr}")
    _check(
        cfg.logger.name in ("csv", "tensorboard"),
        f"logger.name must be csv or tensorboard, got {cfg.logger.name!r}",
    )
    mem = cfg.memory
    _check(
        mem.device in ("auto", "cpu", "cuda"),
        f"memory.device must be auto, cpu or cuda, got {mem.device!r}",
    )
    _check(
        mem.budget_mb is None or mem.budget_mb > 0,
        f"memory.budget_mb must be positive, got {mem.budget_mb}",
    )
    _check(
        mem.safety_margin_mb >= 0,
        f"memory.safety_margin_mb must be >= 0, got {mem.safety_margin_mb}",
    )
    vb = mem.val_batch_size
    _check(
        vb is None or vb == "auto" or (isinstance(vb, int) and vb > 0),
        f"memory.val_batch_size must be a positive number, null or auto, got {vb!r}",
    )
    ob = mem.oom_backoff
    _check(ob.factor > 1, f"memory.oom_backoff.factor must be > 1, got {ob.factor}")
    _check(
        ob.min_batch_size >= 1,
        f"memory.oom_backoff.min_batch_size must be >= 1, got {ob.min_batch_size}",
    )
    _check(
        mem.budget_mb is None or mem.safety_margin_mb < mem.budget_mb,
        f"memory.safety_margin_mb={mem.safety_margin_mb} leaves nothing of "
        f"memory.budget_mb={mem.budget_mb}",
    )
    p = cfg.precision
    _check(
        p.name in ("fp32", "bf16", "int8"),
        f"precision.name must be fp32, bf16 or int8, got {p.name!r}",
    )
    _check(
        p.backend in ("torch.ao", "torchao"),
        f"precision.backend must be torch.ao or torchao, got {p.backend!r}",
    )
    if p.name == "int8" and p.backend == "torchao":
        _check(
            importlib.util.find_spec("torchao") is not None,
            "precision.backend=torchao needs torchao: pip install torchao",
        )
    _check(
        p.qat_start_epoch >= 0, f"precision.qat_start_epoch must be >= 0, got {p.qat_start_epoch}"
    )
    _check(
        p.observer_epochs >= 1, f"precision.observer_epochs must be >= 1, got {p.observer_epochs}"
    )
