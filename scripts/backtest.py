"""`python scripts/backtest.py ...` runs `foxhunt backtest ...`, for old command lines."""

from foxhunt.app.commands import main

if __name__ == "__main__":
    main("backtest")
