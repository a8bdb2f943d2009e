"""The lines a person reads at the end of a run or a backtest, and its last line (`final_line`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from foxhunt.app.report.figures import cross_sectional, listed, ranked
from foxhunt.app.report.scores import ic_figures, spread, unseen_figures
from foxhunt.evaluation.facts import Traded


def console_summary(summary: dict[str, Any], report: Path | None = None) -> list[str]:
    """What a person reads at the end of a run, before its last line: a panel's cross-sectional
    IC first, the test loss and the skill against the strongest baseline (per instrument too: a
    panel's spread, best and worst), direction against its base rate, calibration in one line,
    and where the report is (`report`, default the run's report.md)."""
    m = summary.get("metrics") or {}
    if m.get("test_loss") is None:
        return []
    lines = [_loss_line(m, (summary.get("target") or {}).get("transform"))]
    if cross_sectional(m):
        lines.insert(0, f"cross-sectional {ic_figures(m)}")
    lines += _instrument_lines(m.get("by_instrument") or {})
    if m.get("unseen"):
        lines.append(unseen_figures(m["unseen"]))
    accuracy, up = m.get("test_directional_accuracy"), m.get("test_up_share")
    if accuracy is not None and up is not None:
        lines.append(
            f"direction: {accuracy:.1%} right, against {max(up, 1 - up):.1%} for always "
            f"{'up' if up >= 0.5 else 'down'}"
        )
    if m.get("ic") is not None and not cross_sectional(m):
        pooled = len(m.get("by_instrument") or {}) > 1  # a panel whose dates hold few names
        lines.append(
            ("pooled over dates and names, not by date (too few names a date): " if pooled else "")
            + ic_figures(m)
        )
    horizons = [_horizon_line(h) for h in m.get("horizons") or []]
    if horizons:
        lines.append("; ".join(horizons))
    strategy = summary.get("strategy") or {}
    if strategy.get("sharpe") is not None:
        lines.append(_strategy_line(strategy))
    book = summary.get("book") or {}
    if (book.get("model") or {}).get("sharpe") is not None:
        # a panel leads with what no target transform moves: rank IC by date, then the book
        lines[:0] = [*_rank_ic_lines(book), _book_line(book)]
    elif book.get("skipped"):
        lines.insert(0, f"no cross-sectional book: {book['skipped']}")
    if summary.get("cpu_kernels"):  # (before the calibration, which ends what a person reads)
        lines.append(kernels_line(summary["cpu_kernels"]))
    lines += _coverage_lines(summary)
    if report is None and summary.get("run_dir"):
        report = Path(summary["run_dir"]) / "report.md"
    if report is not None and report.is_file():
        lines.append(f"report: {report}")
    return lines


def _loss_line(m: dict[str, Any], transform: str | None = None) -> str:
    """The test loss (calibrated too) and the skill against the strongest baseline, like for
    like: the model's own quantiles against the baseline's, and both calibrated alike; the
    target they were measured on named where it was transformed."""
    on = "" if transform in (None, "none") else f" on the {transform} target"
    line = f"test loss {m['test_loss']:.4f} (quantile loss{on}, normalized)"
    if m.get("calibrated_test_loss") is not None:
        line = line[:-1] + f"; calibrated {m['calibrated_test_loss']:.4f})"
    if m.get("skill") is not None:
        verdict = "beats" if m["skill"] > 0 else "does not beat"
        calibrated = m.get("calibrated_skill")
        alike = "" if calibrated is None else f", {calibrated:+.1%} both calibrated alike"
        line += (
            f"; skill {m['skill']:+.1%}{alike} against {m['best_baseline']}, the strongest "
            f"baseline: the model {verdict} it"
        )
    return line


def _rank_ic_lines(book: dict[str, Any]) -> list[str]:
    """'rank IC by date, horizon 1: model +0.215 (ICIR 2.17, t 9.1), lightgbm +0.247 (...)':
    each horizon's, the model's beside the strongest baseline's on the same dates."""
    theirs = {r["horizon"]: r for r in book.get("best_baseline_ic_by_horizon") or []}

    def figures(r: dict[str, Any] | None) -> str:
        if r is None or r.get("rank_ic") is None:
            return "n/a"
        icir = "n/a" if r.get("icir") is None else f"{r['icir']:.2f}"
        t = "n/a" if r.get("rank_ic_t") is None else f"{r['rank_ic_t']:.1f}"
        return f"{r['rank_ic']:+.3f} (ICIR {icir}, t {t})"

    rows = book.get("ic_by_horizon") or []
    shown = [r for r in rows if r["horizon"] in (1, Traded.book(book).horizon)]
    return [
        f"rank IC by date (raw returns), horizon {r['horizon']}: model {figures(r)}, "
        f"best baseline {figures(theirs.get(r['horizon']))}"
        + (f", over {r['dates']} dates" if r.get("dates") else "")
        for r in shown
    ]


def _instrument_lines(per: dict[str, dict]) -> list[str]:
    """The skill per instrument: a panel's spread, best and worst; a few instruments' each."""
    order = ranked(per)
    parts = listed(order, order)
    if len(parts) > 1:  # a panel
        lines = [f"skill per instrument: {spread([per[n]['skill'] for n in order], 'skill')}"]
        for title, names in parts:
            lines.append(f"  {title}: " + ", ".join(f"{n} {per[n]['skill']:+.1%}" for n in names))
        return lines
    if len(order) > 1:
        each = [
            f"{name} {p['skill']:+.1%} ({p['best_baseline']})"
            for name, p in per.items()
            if p.get("skill") is not None
        ]
        return ["skill per instrument: " + ", ".join(each)]
    return []


def _horizon_line(h: dict[str, Any]) -> str:
    """ "horizon 1: IC +0.123 (t 4.5), skill +1.2%": one step's figures, apart from the pool."""
    t = "n/a" if h.get("ic_t") is None else f"{h['ic_t']:.1f}"
    line = f"horizon {h['horizon']}: IC " + ("n/a" if h.get("ic") is None else f"{h['ic']:+.3f}")
    line += f" (t {t})"
    return line + ("" if h.get("skill") is None else f", skill {h['skill']:+.1%}")


def _strategy_line(strategy: dict[str, Any]) -> str:
    """The strategy's Sharpe ratio after costs, its standard error, and buy-and-hold's."""
    hold = strategy["buy_and_hold"].get("sharpe")
    se = strategy.get("sharpe_se")
    t = Traded.strategy(strategy)
    return (
        f"strategy ({t.rule}, {t.cost_bps:g} bp costs, traded {t.execution_lag} bar(s) later"
        f"{t.legs}): "
        "Sharpe "
        f"{strategy['sharpe']:.2f} after costs"
        + ("" if se is None else f" (standard error {se:.2f})")
        + ", buy and hold "
        + ("n/a" if hold is None else f"{hold:.2f}")
    )


def _book_line(book: dict[str, Any]) -> str:
    """The cross-sectional book's net Sharpe ratio, the best baseline's and the market's."""

    def sharpe(key: str) -> str:
        value = (book.get(key) or {}).get("sharpe")
        return "n/a" if value is None else f"{value:.2f}"

    t = Traded.book(book)
    return (
        f"cross-sectional book (top {book['top']:.0%} long and short by "
        f"{t.rule}, {t.cost_bps:g} bp costs, traded "
        f"{t.execution_lag} bar(s) later on the horizon-{t.horizon} "
        f"forecast): Sharpe {sharpe('model')} after costs, best baseline's "
        f"{sharpe('best_baseline')}, the market {sharpe('market')}"
    )


def _coverage_lines(summary: dict[str, Any]) -> list[str]:
    """The outer interval's test coverage: before and after calibration, else the model's."""
    quantiles = summary.get("quantiles")
    coverage = (summary.get("metrics") or {}).get("test_coverage")
    cal = summary.get("calibration") or {}
    if cal.get("before", {}).get("intervals"):
        return [_calibration_line(cal)]
    if quantiles and coverage is not None:
        nominal = quantiles[-1] - quantiles[0]
        return [
            f"calibration: the {quantiles[0]:g}-{quantiles[-1]:g} interval held {coverage:.1%} "
            f"of the test targets (nominal {nominal:.0%})"
        ]
    return []


def _calibration_line(cal: dict[str, Any]) -> str:
    """The outer interval's test coverage and width before and after calibration, in one line."""
    b, a = cal["before"]["intervals"][0], cal["after"]["intervals"][0]
    lo, hi = b["levels"]
    return (
        f"calibration ({cal['method']}): the {lo:g}-{hi:g} interval held {b['coverage']:.1%} "
        f"-> {a['coverage']:.1%} of the test targets (nominal {b['nominal']:.0%}), width "
        f"{b['width']:.3g} -> {a['width']:.3g}, pinball {cal['before']['pinball']:.4f} -> "
        f"{cal['after']['pinball']:.4f}: {cal['verdict'] or 'not calibrated'}"
    )


FINAL = "; every figure in "  # before the summary's path, at the end of the last line


def kernels_line(kernels: dict[str, Any]) -> str:
    """Whether the C kernels ran, which build, or why not (`cpu_kernels.report`)."""
    if kernels["ran"]:
        return f"CPU kernels: {kernels['build']} ran ({kernels['vector_width']} floats a vector)"
    return f"CPU kernels did not run: {kernels['why_not']}"


def final_line(summary: dict[str, Any], path: Path) -> str:
    """The last line of a run or a backtest: its directory, its headline figures and `path`,
    the JSON file with every figure (what a script reads: `summary_path`)."""
    m = summary.get("metrics") or {}
    figures = []
    if m.get("skill") is not None:
        figures.append(f"skill {m['skill']:+.1%} against {m['best_baseline']}")
    if m.get("test_loss") is not None:
        figures.append(f"test loss {m['test_loss']:.4f}")
    if m.get("ic") is not None:
        figures.append(f"{'cross-sectional ' if cross_sectional(m) else ''}IC {m['ic']:+.3f}")
    book = ((summary.get("book") or {}).get("model") or {}).get("sharpe")
    if book is not None:
        figures.append(f"book Sharpe {book:.2f} after costs")
    what = "backtest" if "backtest_dir" in summary else "run"
    return f"{what} {path.parent}: {', '.join(figures) or 'no test figures'}{FINAL}{path}"


def summary_path(last_line: str) -> Path:
    """The JSON file a run's or a backtest's last line names (`final_line`)."""
    if FINAL not in last_line:
        raise ValueError(f"not the last line of a foxhunt run: {last_line[:200]!r}")
    return Path(last_line.rsplit(FINAL, 1)[1])
