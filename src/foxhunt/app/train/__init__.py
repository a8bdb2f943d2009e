"""`foxhunt train` and `foxhunt estimate-memory`: one training run as its phases, and its
parts (the assembled Trainer, DDP, MLflow tracking, a sweep's summary)."""
