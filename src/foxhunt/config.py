"""Structured config schemas: one dataclass per Hydra group, and each command's, all registered
by `register_configs`. The semantic checks run after composition, before any data is read, live
in `foxhunt.checks`; `validate` and `parse_time` are importable from here too."""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field, make_dataclass
from enum import StrEnum
from typing import Any

import lightning as L
from foxhunt_serve import PANEL_NAMES as PANEL_NAMES  # a panel's names: auto's transform, book
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# the checks on these schemas (foxhunt.checks), re-exported for the commands that compose them
from foxhunt.checks import parse_time as parse_time
from foxhunt.checks import validate as validate

# The closed sets of string values: one outside fails at composition, naming the allowed ones.
# StrEnum: each member is its string (`cfg.nan_policy == "ffill"`, f-strings print the value),
# its name its value, so `OmegaConf.to_container(..., enum_to_str=True)` gives back what the
# user wrote; checkpoints and summary.json take only such strings (weights-only loading).
TimeUnit = StrEnum("TimeUnit", ["s", "ms", "us", "ns"])
TargetKind = StrEnum("TargetKind", ["auto", "return", "level"])  # naive: zero return, last value
TargetScale = StrEnum("TargetScale", ["instrument", "global"])  # foxhunt_serve.scaling
CrossSection = StrEnum("CrossSection", ["none", "rank", "zscore"])  # foxhunt.data.panel_inputs
TargetTransform = StrEnum("TargetTransform", ["auto", "none", "xs_demean", "xs_rank"])
NanPolicy = StrEnum("NanPolicy", ["error", "ffill", "drop"])
Schedule = StrEnum("Schedule", ["cosine", "onecycle", "none"])  # cosine: linear warm-up first
# Lightning's precision flags foxhunt trains in: fp32's and bf16's (int8 trains in float32)
TrainerPrecision = StrEnum("TrainerPrecision", ["32-true", "bf16-mixed"])
QatBackend = StrEnum("QatBackend", ["torch.ao", "torchao"])
Device = StrEnum("Device", ["auto", "cpu", "cuda"])
Resume = StrEnum("Resume", ["auto", "auto_or_new"])
BacktestMode = StrEnum("BacktestMode", ["expanding", "rolling"])
Refit = StrEnum("Refit", ["full", "finetune"])  # finetune: from the previous fold's weights
# auto: the cross-sectional book on a panel of at least PANEL_NAMES instruments, else none
Book = StrEnum("Book", ["auto", "none", "cross_section"])
BookWeights = StrEnum("BookWeights", ["equal", "risk"])
BookRank = StrEnum("BookRank", ["forecast", "score"])
Pruner = StrEnum("Pruner", ["median", "halving", "none"])  # a tuning study's (Optuna's)
# sign: one unit long or short by the median forecast; scaled: median / predicted spread, +-1
StrategyRule = StrEnum("StrategyRule", ["sign", "scaled"])
# none: the model's quantiles as they are (in order); cqr: conformal offsets fitted on the
# validation windows; aci: those offsets adapted online to each realized outcome
CalibrationMethod = StrEnum("CalibrationMethod", ["none", "cqr", "aci"])
# what a run reports (summary.json's metrics) and a sweeper may optimise
_METRICS = ["val_loss", "test_loss", "test_mae", "test_directional_accuracy", "test_coverage"]
Metric = StrEnum("Metric", [*_METRICS, "baseline_test_loss"])


@dataclass
class OhlcvConfig:
    """Raw bar column names and the derived feature families (see `foxhunt.data.features`; the
    gap, the open's one view, lifted drift250's LightGBM rank IC, #67)."""

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
    gap_windows: list[int] = field(default_factory=lambda: [1])
    calendar: bool = True
    # time-of-day and cash-session encodings: auto (off for daily bars), true or false
    intraday: Any = "auto"
    # Total number of derived features; families are extended on a grid to reach it (225 = seed).
    num_features: int | None = None


RollRule = StrEnum("RollRule", ["volume", "open_interest", "days_before_expiry", "fixed"])
RollAdjust = StrEnum("RollAdjust", ["ratio", "difference", "none"])


@dataclass
class RollConfig:
    """When a root's next contract takes over, and how history is adjusted (data.futures)."""

    rule: RollRule = RollRule.volume
    confirm_bars: int = 3  # volume / open_interest: consecutive bars the next one leads
    days: int = 5  # days_before_expiry: calendar days before the front's expiry
    dates: list[str] = field(default_factory=list)  # fixed: one ISO time per roll
    open_interest_column: str | None = None
    # each contract's expiry (a date or timestamp column); null: the third Friday of its month
    expiry_column: str | None = None
    # the derived inputs, ratios of prices, come from ratio-adjusted prices with every choice
    # (difference would make them depend on later rolls; none would make a roll bar's return
    # the spread)
    adjust: RollAdjust = RollAdjust.ratio
    # a front that expires with no roll signal: false rolls at its last bar with a warning,
    # true is an error
    strict: bool = False


@dataclass
class FuturesConfig:
    """Contracts of one root as one continuous, back-adjusted series (foxhunt.data.futures)."""

    # true | false | auto: on when every id of data.group_column parses as a contract
    # (`foxhunt.data.names`, before the data is read)
    enabled: Any = False
    # data.group_column holds the contract id (ESH6, ...); the instrument becomes its root:
    # root_column's value, else the `root` group of root_pattern matched on the id
    root_column: str | None = None
    root_pattern: str = r"^(?P<root>[A-Z0-9]+?)(?P<month>[FGHJKMNQUVXZ])(?P<year>\d{1,4})$"
    roll: RollConfig = field(default_factory=RollConfig)


@dataclass
class SplitConfig:
    """Calendar cuts shared by every instrument (`foxhunt.data.splits`)."""

    # ISO date/time (UTC unless it names an offset) where the validation / test period starts;
    # null: cut the common timeline at data.val_fraction / data.test_fraction from its end
    val_start: str | None = None
    test_start: str | None = None
    # bars before each cut that hold no target of the earlier split; null: prediction_length
    embargo: int | None = None
    # the first training target / the end of the test period (a walk-forward fold); null: the
    # data's first / last bar
    train_start: str | None = None
    test_end: str | None = None


# the steps after the data: bars (the local times and weekdays the instrument had bars) or
# continuous (every bar interval: the rule before data.calendar, that old checkpoints keep)
Session = StrEnum("Session", ["bars", "continuous"])


@dataclass
class CalendarConfig:
    """The exchange's clock (`foxhunt_serve.clock`): the time zone the calendar features are
    computed in, the cash close, and the sessions the steps after the data follow."""

    time_zone: str = "UTC"  # an IANA name: America/New_York, America/Chicago, Europe/London
    # the cash close, HH:MM local (to_cash_close); null: 20:00 in UTC, 16:00 in another zone
    # (New York's equity close; 15:00 for Chicago's equity index futures)
    close: str | None = None
    session: Session = Session.bars
    # local dates with no session (2026-12-25): the steps after the data skip them
    holidays: list[str] = field(default_factory=list)
    # an exchange (XNYS, CMES or XCME, XLON): its sessions, holidays and early closes from the
    # exchange_calendars library (pip install 'foxhunt[calendars]'), and its zone where
    # time_zone is UTC; null: the sessions of the bars
    exchange: str | None = None


@dataclass
class DataConfig:
    path: str = MISSING
    time_column: str = "timestamp"
    # the unit of an integer time column (a Parquet timestamp column carries its own)
    time_unit: TimeUnit | None = None
    group_column: str | None = None
    # None with features=ohlcv: the 1-bar log return of the close, predicted for the next bars.
    target: str | None = None
    # auto: return for the derived target or clearly returns (foxhunt.data.target), else level
    target_kind: TargetKind = TargetKind.auto
    # each instrument's target on its own training rows' scale, which the model also sees as a
    # static input (instrument; foxhunt_serve.scaling), or one pooled scale (global)
    target_scale: TargetScale = TargetScale.instrument
    # each date's cross-section (foxhunt.data.panel_inputs): every input's rank or z-score
    # among the names then beside it; the names' mean target, dispersion and breadth as inputs;
    # the target less their mean, or its rank (auto: less their mean on a panel of returns)
    cross_section: CrossSection = CrossSection.none
    market_context: bool = False
    target_transform: TargetTransform = TargetTransform.auto
    features: Any = "all"  # "all" | "ohlcv" | [column, ...]
    # columns of the file as observed inputs beside `features` (your signals, say)
    extra_features: list[str] = field(default_factory=list)
    known_features: list[str] = field(default_factory=list)
    static_features: list[str] = field(default_factory=list)
    ohlcv: OhlcvConfig = field(default_factory=OhlcvConfig)
    calendar: CalendarConfig = field(default_factory=CalendarConfig)
    encoder_length: int = 64
    prediction_length: int = 8
    val_fraction: float = 0.15  # of the common timeline (all instruments' distinct times)
    # the last share of the validation period's dates, kept out of validation (early stopping,
    # the checkpoint's choice) for the conformal calibration alone, with an embargo of the
    # windows across the cut: a calibration set the model was not chosen on (0: calibrate on
    # the validation windows themselves). 0.5 held test coverage nearer nominal than 0 on the
    # sample and a 250-name panel (docs/evaluation.md)
    calibration_share: float = 0.5
    test_fraction: float = 0.15
    split: SplitConfig = field(default_factory=SplitConfig)
    futures: FuturesConfig = field(default_factory=FuturesConfig)
    batch_size: int = 64
    num_workers: int = 0
    nan_policy: NanPolicy = NanPolicy.error
    generate_if_missing: bool = False  # the bundled sample is generated on first use
    # auto | true | false: one instrument at a time into a disk-backed window store (data.store);
    # auto: when in memory would take over half the free memory, unless a cross-section needs it
    lazy: Any = "auto"
    cache_dir: str | None = None  # the window store's folder; None: .foxhunt-cache by the data


@dataclass
class ModelConfig:
    """The TFT's architecture; these defaults are model=tft_small (the one place they live)."""

    hidden_dim: int = 64
    num_heads: int = 4
    lstm_layers: int = 1
    dropout: float = 0.1
    variable_dim: int = 16  # width of each variable's own network (pf: hidden_continuous_size)
    quantiles: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9])
    # a linear forecast of the last inputs added to the quantiles (foxhunt.models.blocks.Highway)
    highway: bool = True
    # quantiles in order by construction (foxhunt.models.blocks.MonotoneQuantiles)
    monotone: bool = True
    # the highway added before the monotone head, one weight per quantile: the order of the
    # models trained before #45 (false: one forecast added after it, to every quantile alike)
    highway_first: bool = False
    # false (measured better, docs/panels.md): no id input; true: a row per training name and
    # one for a name not seen, learned by hiding names on unseen_share of the training windows
    instrument_embedding: bool = False
    unseen_share: float = 0.1
    ensemble: int = 1  # k TFTs trained side by side, forecasting their mean (models.ensemble)
    # torch.compile: auto (the device's measured default, training.module.COMPILE_BY_DEVICE),
    # true, false or a mode (checks.COMPILE_MODES); not the architecture: resume may toggle it
    compile: Any = "auto"


@dataclass
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 1e-2
    schedule: Schedule = Schedule.cosine
    warmup_fraction: float = 0.05
    # the schedule's length in epochs; None: trainer.max_epochs (train 2 of 4, resume to 4)
    schedule_epochs: int | None = None
    # the schedule's length in optimizer steps, rounded up to whole epochs (its end is
    # validated), where training ends (trainer.max_epochs a ceiling, early stopping may end it
    # sooner); None: trainer.max_epochs or schedule_epochs. 800: the positive controls' need
    schedule_steps: int | None = 800
    xs_weight: Any = "auto"  # of loss.cross_sectional_loss (#69); auto: loss.xs_weight_of


@dataclass
class PrecisionConfig:
    """fp32, bf16 or int8 (foxhunt.precision.name_of): what the settings train in."""

    trainer_precision: TrainerPrecision = TrainerPrecision["32-true"]  # Lightning's flag
    qat: bool = False  # int8: quantization-aware training, then an int8 export
    backend: QatBackend = QatBackend["torch.ao"]  # int8: the quantization-aware training backend
    qat_start_epoch: int = 0  # int8: train in float before this epoch, fake-quantized from it
    observer_epochs: int = 1  # int8: epochs from qat_start_epoch during which ranges are observed


# Trainer arguments foxhunt sets itself: from precision=, logger= and callbacks=, its checkpoint
# IO, and the run directory
SET_BY_FOXHUNT = ("precision", "logger", "callbacks", "plugins", "default_root_dir")


def _trainer_field(param: inspect.Parameter, hint: Any) -> tuple[str, Any, Any]:
    """A field of TrainerConfig: the argument's own type where it is one plain type or
    Optional of one (max_epochs: int | None), checked at composition; Any for the rest (unions,
    Literal flags, Lightning objects), which lightning.Trainer checks when it is built.
    (OmegaConf 2.3 also fails to merge union fields of a nested dataclass.)"""
    types = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    if len(types) != 1 or types[0] not in (int, float, bool, str):
        hint = Any
    return param.name, hint, field(default=param.default)


def _trainer_config() -> type:
    """The trainer group's schema: every argument of `lightning.Trainer` (its defaults) but
    those foxhunt sets, so any of them is a `trainer.<arg>=` override and a misspelled one
    fails at composition."""
    hints = typing.get_type_hints(L.Trainer.__init__)
    params = inspect.signature(L.Trainer.__init__).parameters.values()
    fields = [
        _trainer_field(p, hints[p.name])
        for p in params
        if p.name != "self" and p.name not in SET_BY_FOXHUNT
    ]
    # gradient_clip_val stays a Trainer argument here; the module clips
    # (see app.assemble.make_trainer)
    return make_dataclass(
        "TrainerConfig", [("_target_", str, field(default="lightning.Trainer")), *fields]
    )


TrainerConfig = _trainer_config()


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

    budget_mb: float | None = None  # act as if the device had only this much; None = all of it
    safety_margin_mb: float = 256.0  # kept free of the budget
    val_batch_size: Any = None  # a number, null (= the training batch size) or auto (searched)
    device: Device = Device.auto  # the device to plan for
    batch_size_search: BatchSizeSearchConfig = field(default_factory=BatchSizeSearchConfig)
    oom_backoff: OomBackoffConfig = field(default_factory=OomBackoffConfig)
    release_optimizer_state: bool = False  # move it off the device during validation
    clear_cache_every_n_batches: int = 0  # validation batches; 0 = never
    clear_cache_in_training: bool = False  # also every n training batches
    gradient_checkpointing: bool = False  # recompute the LSTM and attention in backward
    log_memory: bool = True  # [MEMORY] lines and memory metrics at each phase
    # CUDA, planned from the trace: the caching allocator reserves more than it hands out, and
    # the context (kernels, cuBLAS/cuDNN handles) sits outside both; a CUDA budget caps the
    # allocator at budget_mb less the context. The context measured 619 MB after CUDA's
    # initialisation and 781 MB after the steps on an H200 (torch 2.11, CUDA 13.0;
    # benchmarks/results/gpu_check_h200_2026-11-30.json): 800 MB covers both.
    cuda_reserve_fraction: float = 0.1
    cuda_context_mb: float = 800.0


@dataclass
class BacktestConfig:
    """Walk-forward folds (`foxhunt.app.backtest.folds`); spans are bars of the common timeline."""

    folds: int = 5
    mode: BacktestMode = BacktestMode.expanding  # rolling: train_span bars of training per fold
    test_span: int | None = None  # null: the last data.test_fraction of the timeline, split evenly
    val_span: int | None = None  # null: data.val_fraction of the bars before the first test period
    train_span: int | None = None  # rolling; null: what the first fold trains on
    refit: Refit = Refit.full
    fold: int | None = None  # run this fold alone (a multirun's job: -m backtest.fold=0,1,2)


@dataclass
class TuneConfig:
    """An Optuna study over walk-forward validation periods (`foxhunt.app.tune.search`)."""

    trials: int = 20  # finished trials (completed or pruned) the study ends with
    jobs: int = 1  # worker processes on this machine, sharing the study
    # validation periods, each val_span bars, ending where the backtest's first test period
    # starts: a trial trains and validates once per period, reading nothing later
    folds: int = 3
    storage: str | None = None  # an RDB URL (postgresql://...); None: a journal file
    study: str | None = None  # None: named after the command's overrides
    dir: str = "outputs/tune"  # the studies' directories (journal, trials, refit, report)
    pruner: Pruner = Pruner.median
    startup_trials: int = 5  # trials before the sampler models and the pruner prunes
    refit: bool = True  # then the best configuration refit per backtest fold and tested
    worker: int | None = None  # a multirun's job (-m tune.worker=0,1,...): it searches only
    heartbeat_s: float = 30.0  # how often a running trial says it is alive
    grace_s: float = 300.0  # a running trial silent this long is dead (re-run on resume)


@dataclass
class EvalConfig:
    """How a run's test forecasts are judged (`foxhunt.evaluation.quality`)."""

    stride: int | None = None  # windows apart for the IC and hit rates; None: prediction_length
    strategy: StrategyRule = StrategyRule.sign  # each instrument's own time series strategy
    # bars between the forecast's close and the trade, for the strategy and the book: each
    # holds the bar after the trade, ranked on its forecast (horizon execution_lag + 1)
    execution_lag: int = 1
    # per unit of turnover, for the strategy and the book: between a liquid future's ~1 bp
    # and a mid-cap stock's spread and impact (~10); set it for your market
    cost_bps: float = 5.0
    # the cross-sectional book (`foxhunt.evaluation.book`): each date the top book_top of the
    # names long, the bottom book_top short, ranked by book_rank (the median forecast, or
    # score: the median over its q0.9 - q0.1 spread); a date with fewer than book_min_names
    # names holds nothing
    book: Book = Book.auto
    book_top: float = 0.2
    book_weights: BookWeights = BookWeights.equal
    book_rank: BookRank = BookRank.forecast
    book_min_names: int = PANEL_NAMES


@dataclass
class CalibrationConfig:
    """How a run calibrates its quantiles after training (`foxhunt.evaluation.calibration`)."""

    method: CalibrationMethod = CalibrationMethod.aci
    gamma: float = 0.005  # aci's step size: how fast the level follows the realized misses
    per_instrument: bool = True  # own offsets for an instrument with min_windows windows
    min_windows: int = 200  # validation windows an instrument needs for offsets of its own


@dataclass
class TrainConfig:
    data: DataConfig = MISSING
    model: ModelConfig = MISSING
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = MISSING
    trainer: TrainerConfig = MISSING  # type: ignore[valid-type]
    # `_target_` nodes built by hydra.utils.instantiate, their arguments checked when built
    logger: dict[str, Any] = MISSING
    callbacks: dict[str, Any] = MISSING
    memory: MemoryConfig = MISSING
    seed: int = 42
    ckpt_path: str | None = None  # an absolute path to a .ckpt resumes training from it
    # auto: the newest last.ckpt of a run with the same overrides; auto_or_new: or a fresh run
    resume: Resume | None = None
    # what the train command returns to a Hydra sweeper: val_loss, test_loss, ...
    optimized_metric: Metric = Metric.val_loss
    report: bool = True  # report.md, interpretation.json and plots in the run directory
    backtest: BacktestConfig | None = None  # walk-forward folds: foxhunt/conf/backtest.yaml
    tune: TuneConfig | None = None  # a tuning study: foxhunt/conf/tune.yaml
    tune_space: dict[str, Any] | None = None  # its space: foxhunt/conf/tune_space/<option>.yaml
    eval: EvalConfig = field(default_factory=EvalConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)


# --- the other commands' configs: conf/predict.yaml, conf/export.yaml, conf/interpret.yaml ---


@dataclass
class PredictOptions:
    all_windows: bool = False  # every complete window, not only each instrument's latest
    batch_size: int | None = None  # None: the largest the memory estimator fits on the device
    device: str = "auto"  # auto (cuda when available) | cpu | cuda
    out: str | None = None  # None: the run directory; a directory gets predictions.parquet
    overwrite: bool = False  # replace an existing predict.out file (never the input data)
    preview_rows: int = 8
    # None: the checkpoint's own calibration method; none | cqr | aci to choose another (aci
    # adapts to the realized targets in the data, walking its windows in time order)
    calibration: CalibrationMethod | None = None


@dataclass
class PredictConfig:
    """conf/predict.yaml: `foxhunt predict ckpt_path=/abs/x.ckpt [data...]`."""

    data: DataConfig = MISSING
    ckpt_path: str | None = None
    predict: PredictOptions = field(default_factory=PredictOptions)


# torch.onnx translates to opset 18 (its torchlib's) and converts to a later one when asked
MIN_OPSET = 18


@dataclass
class ExportOptions:
    out: str | None = None  # None: the run directory; model.onnx and model.json go inside
    opset: int = MIN_OPSET  # the ONNX opset (18 or later)
    overwrite: bool = False  # replace an export already in export.out


@dataclass
class ExportConfig:
    """conf/export.yaml: `foxhunt export ckpt_path=/abs/x.ckpt [export...]`."""

    data: DataConfig = MISSING
    ckpt_path: str | None = None
    export: ExportOptions = field(default_factory=ExportOptions)


@dataclass
class InterpretConfig:
    """conf/interpret.yaml: `foxhunt interpret ckpt_path=/abs/x.ckpt [data...]`."""

    data: DataConfig = MISSING
    ckpt_path: str | None = None
    out_dir: str | None = None  # None: the Hydra run directory
    top_k: int = 10  # variables per selection network in the importance plot
    windows_per_instrument: int = 3  # test windows per instrument in the forecast fan chart
    device: str = "auto"  # auto (cuda when available) | cpu | cuda


# every command's schema, by the name its conf/<command>.yaml lists in its defaults
SCHEMAS = {
    "train_schema": TrainConfig,
    "predict_schema": PredictConfig,
    "export_schema": ExportConfig,
    "interpret_schema": InterpretConfig,
}


def register_configs() -> None:
    """Register every command's schema so its YAML is type-checked at composition
    (`foxhunt.app.cli.run` does, before any script composes its config)."""
    cs = ConfigStore.instance()
    for name, node in SCHEMAS.items():
        cs.store(name=name, node=node)
