"""`foxhunt backtest`: walk-forward folds, each a training run, pooled and reported."""
