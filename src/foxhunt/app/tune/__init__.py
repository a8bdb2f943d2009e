"""`foxhunt tune`: an Optuna study over walk-forward folds, its storage and its report."""
