"""Three runs with trainer.deterministic=true on 2 threads beside a process that is busy half
the time (what makes foxhunt's CPU sharing change the thread count): 4 epochs straight twice, and
2 epochs resumed to 4. Writes `<out>/runs.json`: each run's val losses, final weights' digest
and the intra-op thread counts its batches ran with. Run as `python determinism_probe.py <out>`
(a process of its own: the test workers run one thread each)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import lightning as L
import torch

from foxhunt.app.train.phases import train
from foxhunt.threads import use_cpus
from tests.helpers import compose_train, make_table, tiny_overrides, write_table

# busy 0.2 s, idle 0.2 s, for ever: the load the sharing sees changes between its looks
COMPETITOR = """import time
while True:
    t = time.time() + 0.2
    while time.time() < t:
        pass
    time.sleep(0.2)"""
COMMON = (
    "trainer.deterministic=true",
    "optim.schedule=cosine",
    "optim.schedule_epochs=4",
    "model.hidden_dim=32",
    "model.num_heads=4",
    "data.batch_size=32",
    "callbacks.early_stopping_patience=null",
)


class Threads(L.Callback):
    def __init__(self) -> None:
        self.seen: set[int] = set()

    def on_train_batch_end(self, *args: object) -> None:
        self.seen.add(torch.get_num_threads())


def run(table: Path, out: Path, *extra: str) -> dict:
    threads = Threads()
    summary = train(
        compose_train(*tiny_overrides(table, *COMMON, *extra)), out, extra_callbacks=[threads]
    )
    last = torch.load(summary["last_checkpoint"], weights_only=True)["state_dict"]
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in last.values())).hexdigest()
    return {
        "val_loss": summary["training"]["val_loss"],
        "weights": digest,
        "threads": sorted(threads.seen),
        "last_checkpoint": summary["last_checkpoint"],
    }


def main(out: Path) -> None:
    print("threads:", use_cpus())
    table = write_table(out / "bars.parquet", make_table({"AAA": 400, "BBB": 300}))
    competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR])
    try:
        runs = {
            "straight": run(table, out / "straight", "trainer.max_epochs=4"),
            "again": run(table, out / "again", "trainer.max_epochs=4"),
            "first": run(table, out / "first", "trainer.max_epochs=2"),
        }
        resume = f"ckpt_path={runs['first']['last_checkpoint']}"
        runs["resumed"] = run(table, out / "resumed", "trainer.max_epochs=4", resume)
    finally:
        competitor.kill()
    (out / "runs.json").write_text(json.dumps(runs))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
