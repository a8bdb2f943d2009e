"""backtest_report.md: a walk-forward backtest's folds and their cut times, each fold's metrics
beside the pooled ones, per instrument, the costed strategy, the cross-sectional book (pooled
over the folds) and the conformal calibration."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from foxhunt.app.render import markdown_table
from foxhunt.app.report.scores import (
    book_section,
    conformal_section,
    headline_section,
    instrument_table,
)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The leaves of nested dicts under dotted keys, but descriptions and timings."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if k in ("by_instrument", "test_by_instrument", "subsampled"):
            continue  # a table of its own; how many training windows a baseline was fit on
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        elif k != "about" and not k.endswith("_s") and not isinstance(v, bool | list):
            out[f"{prefix}{k}"] = v
    return out


def backtest_report(summary: dict[str, Any], cut_keys: Sequence[str], summary_file: str) -> str:
    """backtest_report.md of a backtest's `summary` (`foxhunt.app.backtest.folds.summarize`): the
    folds' cut times (`cut_keys`), their metrics beside the pooled ones; `summary_file` is
    where the summary is written."""
    st, folds = summary["settings"], summary["folds"]
    pooled = _flat(summary["metrics"]) | _flat(summary["baselines"], "baselines.")
    lines = [
        "# Walk-forward backtest",
        "",
        f"{st['folds']} folds, mode={st['mode']}, refit={st['refit']} "
        f"(test_span={st['test_span']}, val_span={st['val_span']}, "
        f"train_span={st['train_span']}; null: the defaults of docs/backtest.md).",
    ]
    if summary["folds_missing"]:
        missing = ", ".join(map(str, summary["folds_missing"]))
        lines.append(f"Not finished: fold {missing} (the pooled figures leave them out).")
    headline = headline_section(summary)  # a panel's cross-sectional IC leads
    lines += [*(["", *headline] if headline else []), "", "## Folds", ""]
    cut_rows = [[f["fold"], *(f["cuts"].get(k) for k in cut_keys), f["test_rows"]] for f in folds]
    lines += markdown_table(["fold", *cut_keys, "test rows"], cut_rows, missing="(data edge)")
    per_fold = [_flat(f["metrics"]) | _flat(f.get("baselines", {}), "baselines.") for f in folds]
    names = list(dict.fromkeys(k for m in per_fold for k in m))
    names += [k for k in pooled if k not in names]
    rows = [[n, *(m.get(n) for m in per_fold), pooled.get(n)] for n in names]
    lines += ["", "## Metrics", ""]
    lines += markdown_table(["metric", *(f"fold {f['fold']}" for f in folds), "pooled"], rows)
    lines += [
        "",
        "Pooled: val_loss is the mean over the folds; the test figures are over every fold's "
        "out-of-sample rows together (oos_predictions.parquet), test_loss normalized by each "
        "fold's target scale as a run's test_loss is. Directional accuracy must beat the "
        "share of up moves (test_up_share) or its complement: always forecasting the more "
        "common direction scores the larger of the two.",
        *_subsampled_folds(folds, summary_file),
        *instrument_table(summary["metrics"].get("by_instrument"), summary["baselines"]),
        *_strategy_table(summary),
        "",
        *book_section(summary, Path(summary.get("backtest_dir", "."))),
        "",
        *conformal_section(summary),
        "",
    ]
    return "\n".join(lines)


def _subsampled_folds(folds: list[dict[str, Any]], summary_file: str) -> list[str]:
    """Which folds fit baselines on a subsample of their training windows."""
    found = [
        str(f["fold"])
        for f in folds
        if any("subsampled" in b for b in (f.get("baselines") or {}).values())
    ]
    if not found:
        return []
    return [
        "",
        f"The baselines of fold {', '.join(found)} were fit on evenly spaced subsamples of the "
        "fold's training windows (how many: the fold's report.md, or `folds[k].baselines` in "
        f"{summary_file}).",
    ]


def _strategy_table(summary: dict[str, Any]) -> list[str]:
    """The costed strategy per fold and over all folds, beside buy-and-hold and the best
    baseline's, by net Sharpe."""
    runs = [(f"fold {f['fold']}", f.get("strategy")) for f in summary["folds"]]
    runs.append(("pooled", summary.get("strategy")))
    rows = []
    for name, s in runs:
        if s and "skipped" not in s:
            theirs = s.get("best_baseline", {}).get("sharpe")
            rows.append(
                [
                    name,
                    s["sharpe"],
                    s.get("sharpe_se"),
                    s["max_drawdown"],
                    s["turnover"],
                    s["net_return"],
                    s["buy_and_hold"]["sharpe"],
                    theirs,
                ]
            )
    if not rows:
        return []
    head = [
        "",
        "Sharpe (net)",
        "se",
        "max drawdown",
        "turnover",
        "net return",
        "buy and hold",
        "best baseline",
    ]
    return ["", "## Strategy", "", *markdown_table(head, rows)]
