"""The semantic checks run right after composition, before any data is read: what the schemas'
types alone cannot express (hidden size divisible by heads, increasing quantiles, split times in
order, ...). `validate` runs each group's checks and raises the first failure as a ConfigError
naming the key; `foxhunt.config` holds the schemas and re-exports `validate` and `parse_time`."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from foxhunt_serve import Clock, InputError

from foxhunt.errors import ConfigError

# torch.compile's modes, which model.compile also takes
NOT_ACROSS = ("none", "auto")  # data.cross_section/target_transform values any data takes
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def parse_time(key: str, value: str | None) -> int | None:
    """An ISO date or date-time setting as int64 nanoseconds since 1970 (UTC unless the value
    names an offset); None stays None."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        raise ConfigError(
            f"{key}={value} is not an ISO date or date-time (2026-03-02 or 2026-03-02T14:30)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: Any) -> None:
    """Semantic checks that types alone cannot express; raises ConfigError naming the key (the
    first failing check, in the order below)."""
    _check_model(cfg.model)
    _check(
        cfg.model.ensemble == 1 or not cfg.precision.qat,
        f"model.ensemble={cfg.model.ensemble} with precision=int8: an ensemble trains and "
        "exports in fp32 or bf16 (its int8 export is not built)",
    )
    _check_windows(cfg.data)
    _check_eval(cfg.eval, cfg.calibration, cfg.data.prediction_length)
    _check_schedule(cfg.optim)
    _check_fractions(cfg.data)
    _check_split(cfg.data.split)
    _check_inputs(cfg.data)
    _check_calendar(cfg.data)
    _check(cfg.optim.lr > 0, f"optim.lr must be positive, got {cfg.optim.lr}")
    xs = cfg.optim.xs_weight
    _check(
        xs == "auto" or (isinstance(xs, int | float) and not isinstance(xs, bool) and xs >= 0),
        f"optim.xs_weight must be auto or a number >= 0, got {xs!r}",
    )
    _check_memory(cfg.memory)
    _check_trainer(cfg.trainer)


def _check_model(m: Any) -> None:
    """model.*: positive sizes, heads that divide the hidden size, increasing quantiles."""
    _check(m.hidden_dim > 0, f"model.hidden_dim must be positive, got {m.hidden_dim}")
    _check(m.num_heads > 0, f"model.num_heads must be positive, got {m.num_heads}")
    _check(
        m.hidden_dim % m.num_heads == 0,
        f"model.hidden_dim={m.hidden_dim} is not divisible by model.num_heads={m.num_heads}",
    )
    _check(m.lstm_layers > 0, f"model.lstm_layers must be positive, got {m.lstm_layers}")
    _check(m.variable_dim > 0, f"model.variable_dim must be positive, got {m.variable_dim}")
    _check(0 <= m.dropout < 1, f"model.dropout must be in [0, 1), got {m.dropout}")
    _check(0 <= m.unseen_share < 1, f"model.unseen_share must be in [0, 1), got {m.unseen_share}")
    _check(m.ensemble >= 1, f"model.ensemble must be at least 1 (members), got {m.ensemble}")
    _check(
        m.compile in (True, False, "auto", *COMPILE_MODES),
        f"model.compile must be auto, true, false or one of {', '.join(COMPILE_MODES)}, "
        f"got {m.compile!r}",
    )
    q = list(m.quantiles)
    _check(
        len(q) > 0 and all(0 < x < 1 for x in q) and all(a < b for a, b in itertools.pairwise(q)),
        f"model.quantiles must be strictly increasing values in (0, 1), got {q}",
    )


def _check_windows(d: Any) -> None:
    """data.*: the window lengths and the batch size."""
    _check(d.encoder_length > 0, f"data.encoder_length must be positive, got {d.encoder_length}")
    _check(
        d.prediction_length > 0,
        f"data.prediction_length must be positive, got {d.prediction_length}",
    )
    _check(d.batch_size > 0, f"data.batch_size must be positive, got {d.batch_size}")


def _check_eval(e: Any, c: Any, horizons: int) -> None:
    """eval.* and calibration.*: how the test forecasts are judged and calibrated."""
    _check(e.stride is None or e.stride > 0, f"eval.stride must be positive, got {e.stride}")
    _check(e.cost_bps >= 0, f"eval.cost_bps must be >= 0, got {e.cost_bps}")
    _check(0 < e.book_top <= 0.5, f"eval.book_top must be in (0, 0.5], got {e.book_top}")
    _check(e.execution_lag >= 0, f"eval.execution_lag must be >= 0, got {e.execution_lag}")
    _check(
        e.execution_lag < horizons,
        f"eval.execution_lag={e.execution_lag} trades the forecast of bar "
        f"{e.execution_lag + 1}, beyond data.prediction_length={horizons}: lower the lag or "
        "forecast further",
    )
    _check(e.book_min_names >= 2, f"eval.book_min_names must be >= 2, got {e.book_min_names}")
    _check(0 < c.gamma < 1, f"calibration.gamma must be in (0, 1), got {c.gamma}")
    _check(c.min_windows > 0, f"calibration.min_windows must be positive, got {c.min_windows}")


def _check_schedule(o: Any) -> None:
    """optim.*: the learning-rate schedule's length."""
    _check(
        o.schedule_epochs is None or o.schedule_epochs > 0,
        f"optim.schedule_epochs must be positive or null, got {o.schedule_epochs}",
    )
    _check(
        o.schedule_steps is None or o.schedule_steps > 0,
        f"optim.schedule_steps must be positive or null, got {o.schedule_steps}",
    )


def _check_fractions(d: Any) -> None:
    """data.*: the loader's workers and the validation and test shares of the timeline."""
    _check(d.num_workers >= 0, f"data.num_workers must be >= 0, got {d.num_workers}")
    _check(
        0 <= d.val_fraction < 1
        and 0 <= d.test_fraction < 1
        and d.val_fraction + d.test_fraction < 1,
        "data.val_fraction and data.test_fraction must be in [0, 1) and sum to less than 1, "
        f"got {d.val_fraction} and {d.test_fraction}",
    )
    share = getattr(d, "calibration_share", 0.0)
    _check(0 <= share < 1, f"data.calibration_share must be in [0, 1), got {share}")


def _check_split(sp: Any) -> None:
    """data.split.*: a non-negative embargo, and the calendar cuts given in order."""
    _check(
        sp.embargo is None or sp.embargo >= 0,
        f"data.split.embargo must be >= 0 bars or null, got {sp.embargo}",
    )
    keys = ("train_start", "val_start", "test_start", "test_end")
    times = {k: parse_time(f"data.split.{k}", getattr(sp, k)) for k in keys}
    given = [k for k in keys if times[k] is not None]
    for a, b in itertools.pairwise(given):
        _check(
            # test_start = test_end: no test period (validation only; nothing from there read)
            times[a] <= times[b] and (times[a] < times[b] or b != "test_end" or a == "test_start"),
            f"data.split.{a}={getattr(sp, a)} is "
            f"{'after' if times[a] > times[b] else 'not before'} data.split.{b}={getattr(sp, b)}",
        )


def _check_inputs(d: Any) -> None:
    """data.*: the futures switch, the feature set and the target it needs."""
    _check(
        d.futures.enabled in (True, False, "auto"),
        f"data.futures.enabled must be true, false or auto, got {d.futures.enabled!r}",
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
    for key, column in (("time_column", d.time_column), ("group_column", d.group_column)):
        _check(
            d.target is None or d.target != column,
            f"data.target={d.target} is the data.{key}: name the numeric column to forecast",
        )
    across = [
        f"data.{k}={d[k]}" for k in ("cross_section", "target_transform") if d[k] not in NOT_ACROSS
    ] + (["data.market_context=true"] if d.get("market_context") else [])
    _check(
        not across or (d.group_column and str(d.lazy).lower() != "true"),
        f"{' and '.join(across)} compare the names at each time: it needs data.group_column "
        "and the panel in memory (data.lazy=false or auto)",
    )


def _check_calendar(d: Any) -> None:
    """data.calendar.*: a time zone this machine knows, a close HH:MM, ISO holidays, an
    exchange exchange_calendars knows."""
    try:
        Clock.of(getattr(d, "calendar", None))
    except InputError as exc:
        raise ConfigError(f"data.calendar: {exc}") from None


def _check_memory(mem: Any) -> None:
    """memory.*: the budget and its margin, the validation batch, the OOM backoff."""
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


def _check_trainer(t: Any) -> None:
    """trainer.*: the arguments foxhunt's manual optimization cannot honour."""
    # TFTModule optimizes manually (its step splits a batch that does not fit): Lightning then
    # refuses gradient accumulation, but only inside fit(), once the data is read
    _check(
        t.accumulate_grad_batches == 1,
        f"trainer.accumulate_grad_batches={t.accumulate_grad_batches} does not work with "
        "foxhunt's manual optimization (Lightning refuses it); raise data.batch_size instead "
        "(memory.oom_backoff splits a batch that does not fit into micro-batches)",
    )
    _check(
        t.gradient_clip_algorithm in (None, "norm"),
        f"trainer.gradient_clip_algorithm={t.gradient_clip_algorithm} does not work with "
        "foxhunt's manual optimization; its step clips the gradient norm to "
        "trainer.gradient_clip_val",
    )
