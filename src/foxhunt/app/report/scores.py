"""The report's sections on how the forecasts score, as markdown lines: the headline IC, the
baselines and the skill per instrument, the IC and calibration, the strategy and the conformal
calibration; the run's report and the backtest's share them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from foxhunt.app.report.figures import SHOWN, cross_sectional, listed, ranked, ranking
from foxhunt.app.report.markdown import table
from foxhunt.app.report.plots import CALIBRATION, IC_BY_HORIZON
from foxhunt.evaluation.facts import Traded

SPREAD = {"min": 0.0, "10%": 0.1, "25%": 0.25, "median": 0.5, "75%": 0.75, "90%": 0.9, "max": 1.0}


def spread(values: list[float], what: str, fmt: str = "{:+.1%}") -> str:
    """'249 instruments, 41% with positive skill; min -12.3%, 10% -5.1%, ..., max +8.2%': how
    `what` is spread over the instruments."""
    v = np.asarray(values, dtype=np.float64)
    at = np.quantile(v, list(SPREAD.values()))
    figures = ", ".join(f"{name} {fmt.format(x)}" for name, x in zip(SPREAD, at, strict=True))
    return f"{len(v)} instruments, {np.mean(v > 0):.0%} with positive {what}; {figures}"


SHOWN_UNSEEN = 5  # the unseen names listed by name (all of them: summary.json)


def ic_figures(m: dict[str, Any]) -> str:
    """'IC +0.021 (se 0.006, t 3.4, 480 dates), rank IC +0.018 (t 2.9)' of the metrics `m`."""
    t = "n/a" if m.get("ic_t") is None else f"{m['ic_t']:.1f}"
    se = "" if m.get("ic_se") is None else f"se {m['ic_se']:.3f}, "
    dates = f", {m['ic_n']} dates" if m.get("ic_mode") == "cross_section" and m.get("ic_n") else ""
    line = f"IC {m['ic']:+.3f} ({se}t {t}{dates})"
    if m.get("rank_ic") is not None:
        rank_t = "n/a" if m.get("rank_ic_t") is None else f"{m['rank_ic_t']:.1f}"
        line += f", rank IC {m['rank_ic']:+.3f} (t {rank_t})"
    return line


def unseen_figures(u: dict[str, Any]) -> str:
    """'names not seen in training (2: NEW, LATE): skill +0.4% against lightgbm on their 120
    test windows, horizon-1 IC +0.052 (t 1.3)' of summary.json's metrics.unseen."""
    names = u["names"]
    shown = ", ".join(names[:SHOWN_UNSEEN]) + (", ..." if len(names) > SHOWN_UNSEEN else "")
    line = f"names not seen in training ({len(names)}: {shown}): "
    line += "no skill scored" if u.get("skill") is None else f"skill {u['skill']:+.1%}"
    line += f" against {u['best_baseline']}" if u.get("best_baseline") else ""
    line += f" on their {u['windows']} test windows"
    if u.get("ic_h1") is not None:
        t = "n/a" if u.get("ic_h1_t") is None else f"{u['ic_h1_t']:.1f}"
        line += f", horizon-1 IC {u['ic_h1']:+.3f} (t {t})"
    return line


def _panel_note(
    parts: list[tuple[str, list[str]]], values: list[float], what: str, fmt: str, by: str
) -> list[str]:
    """A panel's listing comes with the spread of `what` over every instrument and says which
    instruments it shows (the best and worst `by`)."""
    if len(parts) == 1:
        return []
    over = f"{what[0].upper() + what[1:]} over {spread(values, what, fmt)}. " if values else ""
    return [
        "",
        f"{over}Shown: the {SHOWN} best and the {SHOWN} worst instruments by {by} (summary.json "
        "has every one).",
    ]


def _parts_tables(parts: list[tuple[str, list[str]]], head: list[str], row: Any) -> list[str]:
    """One table per part of a listing (`listed`), each titled but a listing in full."""
    lines = []
    for title, names in parts:
        lines += ["", *([f"{title.capitalize()}:", ""] if title else [])]
        lines += table(head, [row(n) for n in names])
    return lines


def headline_section(summary: dict[str, Any]) -> list[str]:
    """A panel's report leads with its cross-sectional IC, with its standard error, and the
    skill pooled and per instrument."""
    m = summary.get("metrics") or {}
    if not cross_sectional(m):
        return []
    lines = [
        "## Headline",
        "",
        f"**Cross-sectional {ic_figures(m)}**: the correlation of the median forecast's move "
        "with the realised one across the instruments at each test date, averaged over the "
        "dates; standard error Newey-West over the dates (a t beyond 2 is unlikely by chance).",
    ]
    if m.get("skill") is not None:
        per = [m["by_instrument"][n]["skill"] for n in ranked(m.get("by_instrument"))]
        lines += [
            "",
            f"Skill against the strongest baseline ({m['best_baseline']}): {m['skill']:+.2%}"
            + (f"; per instrument: {spread(per, 'skill')}." if len(per) > 1 else "."),
        ]
    return lines


def _lightgbm_note(gbm: dict[str, Any]) -> list[str]:
    """What the LightGBM baseline's fit was: its rounds, inputs, rows and time."""
    if "rounds" not in gbm:
        return []
    return [
        f"LightGBM: {gbm['rounds']} rounds by step (its spread's {gbm.get('spread_rounds')}), "
        f"{gbm['inputs']} inputs, {gbm['training_rows']:,} training rows, fit in "
        f"{gbm['fit_s']:.1f} s.",
        "",
    ]


def baselines_section(summary: dict[str, Any]) -> list[str]:
    """Each baseline's losses beside the model's, the skill against the strongest, named, and
    the directional accuracy beside the base rate it must beat."""
    m, baselines = summary.get("metrics") or {}, summary.get("baselines")
    if not baselines:
        return ["## Baselines", "", "(Not scored in this run.)"]
    loss = m.get("test_loss")
    rows = [["**model**", loss, m.get("val_loss"), None, m.get("test_directional_accuracy"), ""]]
    for name, b in baselines.items():
        if "skipped" in b:
            rows.append([name, None, None, None, None, f"skipped: {b['skipped']}"])
            continue
        against = None
        if loss is not None and b.get("test_loss"):
            against = f"{1 - loss / b['test_loss']:+.1%}"
        rows.append(
            [
                name,
                b.get("test_loss"),
                b.get("val_loss"),
                against,
                b.get("test_directional_accuracy"),
                b["about"],
            ]
        )
    head = ["forecast", "test loss", "validation loss", "model's skill", "direction", "what"]
    lines = [
        "## Baselines",
        "",
        "Fit on the training windows only, scored on the model's own validation and test windows "
        "with its quantile loss (normalized); skill = 1 - model's test loss / baseline's.",
        "",
        *table(head, rows),
        "",
    ]
    subsampled = {n: b["subsampled"] for n, b in baselines.items() if "subsampled" in b}
    if subsampled:
        lines += [subsample_note(subsampled), ""]
    lines += _lightgbm_note(baselines.get("lightgbm") or {})
    if m.get("skill") is not None:
        lines.append(
            f"**Skill against the strongest baseline ({m['best_baseline']}): {m['skill']:+.2%}**"
            f" ({'better' if m['skill'] > 0 else 'no better'} than it on the test windows), "
            "the model's own quantiles against the baseline's."
        )
    if m.get("calibrated_skill") is not None:
        lines.append(f"Both calibrated alike: {m['calibrated_skill']:+.2%}.")
    accuracy, up = m.get("test_directional_accuracy"), m.get("test_up_share")
    if accuracy is not None and up is not None:
        lines.append(
            f"Directional accuracy {accuracy:.1%} against a base rate of {max(up, 1 - up):.1%} "
            f"(always {'up' if up >= 0.5 else 'down'}: {up:.1%} of the test moves were up)."
        )
    if m.get("unseen"):  # forecast through the embedding's unseen row, scored apart
        figures = unseen_figures(m["unseen"])
        lines.append(figures[0].upper() + figures[1:] + ".")
    return [*lines, *instrument_table(m.get("by_instrument"), baselines)]


def subsample_note(subsampled: dict[str, dict[str, int]]) -> str:
    """Which baselines were fit on a subsample of the training windows, and of how many."""
    sizes: dict[int, list[str]] = {}
    for name, s in subsampled.items():
        sizes.setdefault(s["to"], []).append(name)
    parts = "; ".join(f"{to:,} for {', '.join(names)}" for to, names in sizes.items())
    total = max(s["from"] for s in subsampled.values())
    return (
        f"Fit on evenly spaced subsamples of the {total:,} training windows: {parts} (the time "
        "a fit takes grows with its windows; `foxhunt.evaluation.baselines`' TABLE_WINDOWS and "
        "MODEL_WINDOWS)."
    )


def instrument_table(
    by_instrument: dict[str, dict] | None, baselines: dict[str, dict]
) -> list[str]:
    """Per instrument: the model's test loss, each baseline's, the skill against the
    instrument's strongest baseline (named), the directional accuracy and the up share; a
    panel's best and worst by skill (`listed`) after the spread over every instrument."""
    if not by_instrument:
        return []
    rivals = [n for n, b in baselines.items() if "skipped" not in b]
    head = ["instrument", "windows", "model", *rivals, "skill", "against", "direction", "up share"]

    def row(name: str) -> list[Any]:
        m = by_instrument[name]
        losses = [baselines[r].get("test_by_instrument", {}).get(name, {}) for r in rivals]
        skill = m.get("skill")
        return [
            name,
            m.get("windows"),
            m.get("test_loss"),
            *(b.get("test_loss") for b in losses),
            None if skill is None else f"{skill:+.1%}",
            m.get("best_baseline"),
            m.get("test_directional_accuracy"),
            m.get("up_share", m.get("test_up_share")),
        ]

    order, by = ranking(by_instrument, by_instrument, "test_loss", "test loss", low=True)
    parts = listed(list(by_instrument), order)
    skills = [m["skill"] for m in by_instrument.values() if m.get("skill") is not None]
    return [
        "",
        "### Per instrument",
        "",
        "Test quantile loss (normalized) of the model and of each baseline on the instrument's "
        "own test windows; skill against the instrument's strongest baseline.",
        *_panel_note(parts, skills, "skill", "{:+.1%}", by),
        *_parts_tables(parts, head, row),
    ]


def quality_section(summary: dict[str, Any], drew: bool) -> list[str]:
    """The IC and rank IC with their standard errors, per horizon and instrument, the hit
    rates against the majority sign, the probabilistic scores, and their plots (`drew`)."""
    m, ev = summary.get("metrics") or {}, summary.get("evaluation")
    if not ev:
        return []
    lines = [
        "## Information coefficient and calibration",
        "",
        f"Over every {ev['stride']}th test window of each instrument ({ev['windows_scored']} of "
        f"{ev['windows']}: targets that do not overlap); standard errors Newey-West over the "
        f"target times ({m.get('ic_mode', '')}). IC: Pearson correlation of the median "
        "forecast's move with the realised one; rank IC: Spearman's.",
        "",
    ]
    head = ["horizon", "IC", "se", "t", "rank IC", "se", "t", "hit rate", "majority sign"]
    keys = ["ic", "ic_se", "ic_t", "rank_ic", "rank_ic_se", "rank_ic_t"]
    rows = [
        [h["horizon"], *(h[k] for k in keys), h["hit_rate"], h["majority_rate"]]
        for h in ev["by_horizon"]
    ]
    rows.append(["all", *(m.get(k) for k in keys), m.get("hit_rate"), m.get("majority_rate")])
    lines += table(head, rows)
    ics = ev["by_instrument"]
    if len(ics) > 1:
        # a panel's: the instruments of the best and worst skill, as in the per-instrument table
        order, by = ranking(m.get("by_instrument"), ics, "ic", "IC")
        parts = listed(list(ics), order)
        values = [i["ic"] for i in ics.values() if i["ic"] is not None]
        lines += _panel_note(parts, values, "IC", "{:+.3f}", by)
        lines += _parts_tables(
            parts, ["instrument", *head[1:7]], lambda n: [n, *(ics[n][k] for k in keys)]
        )
    pinball = ", ".join(
        f"{q:g}: {v:.4f}" for q, v in zip(ev["quantiles"], ev["pinball_by_quantile"], strict=True)
    )
    lines += [
        "",
        f"CRPS (from the quantiles, normalized) {m.get('crps', 0):.4f}; interval (Winkler) score "
        f"of the outer interval {m.get('winkler', 0):.4f}; pinball loss per quantile: {pinball}.",
    ]
    if drew:
        lines += ["", f"![IC by horizon]({IC_BY_HORIZON}) ![calibration]({CALIBRATION})"]
    return lines


def strategy_section(summary: dict[str, Any], run_dir: Path) -> list[str]:
    """The costed strategy of the model, per instrument, beside buy-and-hold and the best
    baseline's, and the equity plot where `run_dir` has one."""
    s = summary.get("strategy")
    if not s:
        return []
    if "skipped" in s:
        return ["## Strategy", "", f"(Not run: {s['skipped']}.)"]
    keys = ["sharpe", "sharpe_se", "max_drawdown", "turnover", "net_return"]
    per = s["by_instrument"]
    order, by = ranking(
        (summary.get("metrics") or {}).get("by_instrument"), per, "sharpe", "Sharpe ratio"
    )
    parts = listed(list(per), order)
    sharpes = [i["sharpe"] for i in per.values() if i.get("sharpe") is not None]
    rows = [["**model (equal-risk portfolio)**", *(s[k] for k in keys)]]
    for title, names in parts:  # a panel's best and worst instruments by skill, so named
        named = [f"model, {n}" + (f" ({title})" if title else "") for n in names]
        rows += [[label, *(per[n][k] for k in keys)] for label, n in zip(named, names, strict=True)]
    rows.append(["buy and hold", *(s["buy_and_hold"][k] for k in keys)])
    if "best_baseline" in s:
        b = s["best_baseline"]
        rows.append([f"best baseline ({b['name']})", *(b[k] for k in keys)])
    t = Traded.strategy(s)
    lines = [
        "## Strategy",
        "",
        f"Positions traded {t.execution_lag} bar(s) after the forecast (`eval.execution_lag`) "
        f"from its forecast of the bar then held, horizon {t.horizon} (`eval.strategy={t.rule}`), "
        f"costs {t.cost_bps:g} bp per unit of turnover{t.legs}; Sharpe annualised from the "
        "bars' frequency; returns summed, not compounded (foxhunt/evaluation/strategy.py).",
        "",
        *table(["strategy", "Sharpe (net)", "se", "max drawdown", "turnover", "net return"], rows),
        *_panel_note(parts, sharpes, "Sharpe ratio", "{:+.2f}", by),
        "",
        "The standard error (Lo 2002, i.i.d. returns) says how far the Sharpe ratio of this "
        "test period can be from zero by chance: a short period of fast bars gives a large one.",
    ]
    if (run_dir / "equity.png").is_file():
        lines += ["", "![equity curves](equity.png)"]
    return lines


def book_section(summary: dict[str, Any], run_dir: Path) -> list[str]:
    """The cross-sectional book beside the best baseline's and the market, its long-short IC by
    horizon and the forecast deciles, and book.png where `run_dir` has one."""
    b = summary.get("book")
    if not b:
        return []
    if "skipped" in b:
        return ["## Cross-sectional book", "", f"(Not run: {b['skipped']}.)"]
    keys = ["sharpe", "gross_sharpe", "max_drawdown", "turnover", "net_return"]
    labels = {"model": "**model**", "best_baseline": "best baseline", "market": "market (long all)"}
    rows = [[label, *(b[k][x] for x in keys)] for k, label in labels.items() if k in b]
    ics = [[r["horizon"], r["rank_ic"], r["rank_ic_t"]] for r in b["ic_by_horizon"]]
    t = Traded.book(b)
    lines = [
        "## Cross-sectional book",
        "",
        f"Each date the {b['names']} names ranked by their {_ranked_by(b)} of the bar held, "
        f"horizon {t.horizon}: the top {b['top']:.0%} long, the bottom "
        f"{b['top']:.0%} short ({b['weights']} weights), traded {t.execution_lag} bar(s) "
        f"after the forecast, a date with fewer than {t.min_names} names flat, costs "
        f"{t.cost_bps:g} bp per unit of turnover (foxhunt/evaluation/book.py).",
        "",
        *table(
            ["book", "Sharpe (net)", "Sharpe (gross)", "max drawdown", "turnover", "net return"],
            rows,
        ),
        "",
        "The long-short rank IC by date, by horizon (Newey-West t):",
        "",
        *table(["horizon", "rank IC", "t"], ics),
        "",
        "Mean realised return of the bar held by ranking decile (lowest first): "
        + ", ".join("-" if x is None else f"{x:+.2e}" for x in b["deciles"])
        + ".",
    ]
    if (run_dir / "book.png").is_file():
        lines += ["", "![the book's equity curves](book.png)"]
    return lines


def _ranked_by(b: dict[str, Any]) -> str:
    """How the book ranked its names, in words."""
    if Traded.book(b).rule == "score":
        return "median forecast over its q0.9 - q0.1 spread"
    return "median forecast"


def conformal_section(summary: dict[str, Any]) -> list[str]:
    """The test forecasts before and after each calibration method, per interval and horizon."""
    cal = summary.get("calibration")
    if not cal or not cal.get("before", {}).get("intervals"):
        return []
    fitted = (
        f"fitted on {cal['calibration_windows']} validation windows"
        if "calibration_windows" in cal
        else "each fold's fitted on its own validation windows"
    )
    lines = [
        "## Conformal calibration",
        "",
        f"`calibration.method={cal['method']}` ({fitted}; "
        "foxhunt/evaluation/calibration.py): the test windows' intervals before (the model's "
        "own quantiles) and after; verdict `better` when the outer interval's coverage is "
        f"nearer its nominal level and the pinball loss no worse. Verdict: **{cal['verdict']}**.",
        "",
    ]
    methods = {"model": cal["before"], **(cal.get("methods") or {cal["method"]: cal["after"]})}
    head = ["forecasts", "interval", "nominal", "coverage", "width", "Winkler", "pinball", "CRPS"]
    rows = [
        [
            name,
            f"{i['levels'][0]:g}-{i['levels'][1]:g}",
            i["nominal"],
            i["coverage"],
            i["width"],
            i["winkler"],
            f["pinball"],
            f["crps"],
        ]  # fmt: skip
        for name, f in methods.items()
        for i in f["intervals"]
    ]
    lines += table(head, rows)
    outer = [f["intervals"][0]["coverage_by_horizon"] for f in methods.values()]
    steps = range(1, len(outer[0]) + 1)
    by_step = [[h, *c] for h, *c in zip(steps, *outer, strict=True)]
    lines += ["", "Coverage of the outer interval per horizon step:", ""]
    lines += table(["horizon", *methods], by_step)
    if cal.get("crossing_rate_model") is not None:
        lines += [
            "",
            f"Quantile crossing: {cal['crossing_rate_model']:.2%} of the model's test steps, "
            f"{cal['crossing_rate']:.2%} after calibration.",
        ]
    return lines
