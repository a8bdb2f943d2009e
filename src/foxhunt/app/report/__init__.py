"""The run report: its figures computed, then rendered as report.md, plots and console lines."""
