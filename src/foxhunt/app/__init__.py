"""The commands: train, predict, backtest, export, interpret, report, and the entry-point
plumbing (`cli`) the scripts call."""
