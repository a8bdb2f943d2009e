"""How a summary's strategy and book traded, read in one place (foxhunt.evaluation.facts)."""

from foxhunt.evaluation.facts import Traded


def test_a_summary_reads_what_its_run_traded():
    strategy = {"rule": "sign", "cost_bps": 5, "execution_lag": 1}
    assert Traded.strategy(strategy) == Traded("sign", 5.0, 1, 2)
    book = {"rank": "score", "cost_bps": 10, "execution_lag": 2, "horizon": 3, "min_names": 10}
    assert Traded.book(book) == Traded("score", 10.0, 2, 3, 10)


def test_a_summary_written_before_a_fact_reads_as_its_run_traded():
    assert Traded.strategy({"rule": "sign", "cost_bps": 5}) == Traded("sign", 5.0, 0, 1)
    old_book = {"cost_bps": 5, "execution_lag": 0}
    assert Traded.book(old_book) == Traded("forecast", 5.0, 0, 1, 2)


def test_a_hedged_strategy_says_so_where_it_is_shown():
    from foxhunt.app.report.console import _strategy_line

    s = {"rule": "sign", "cost_bps": 5, "execution_lag": 1, "sharpe": 1.0, "buy_and_hold": {}}
    assert "against the market" not in _strategy_line(s)
    assert "each name against the market, both legs costed" in _strategy_line(s | {"hedged": True})
