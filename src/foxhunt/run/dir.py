"""The layout of a run directory, in one place: every path a run writes or a later command
reads is a property here, so no other module spells "checkpoints" or "last.ckpt"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

LAST_CKPT = "last.ckpt"  # the latest checkpoint's name (training.checkpointing writes it)
LOCK_NAME = ".foxhunt.lock"  # held by the live run (foxhunt.run.guard)


@dataclass(frozen=True)
class RunDir:
    """One run's directory (Hydra's `hydra.run.dir`, a sweep's job, a backtest's fold)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def of_checkpoint(cls, ckpt_path: str | Path) -> RunDir:
        """The run that wrote `<run>/checkpoints/<name>.ckpt`."""
        return cls(Path(ckpt_path).parent.parent)

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def last_ckpt(self) -> Path:
        """The latest checkpoint: what an interrupted run resumes from."""
        return self.checkpoints / LAST_CKPT

    @property
    def fp32_export(self) -> Path:
        return self.checkpoints / "model_fp32.safetensors"

    @property
    def int8_export(self) -> Path:
        return self.checkpoints / "model_int8.safetensors"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def status(self) -> Path:
        """A job's status line (failed, invalid, interrupted), for the sweep summary."""
        return self.path / "status.json"

    @property
    def hydra(self) -> Path:
        return self.path / ".hydra"

    @property
    def config(self) -> Path:
        """The composed config Hydra saved (or a backtest wrote for its fold)."""
        return self.hydra / "config.yaml"

    @property
    def overrides(self) -> Path:
        """The command line's overrides: what identifies the experiment for resume."""
        return self.hydra / "overrides.yaml"

    @property
    def lock(self) -> Path:
        return self.path / LOCK_NAME

    def in_use(self) -> bool:
        """Whether a live run in another process holds this directory's lock."""
        if not self.lock.exists():
            return False
        probe = FileLock(self.lock)
        try:
            probe.acquire(timeout=0)
        except Timeout:
            return True
        probe.release()
        return False

    def holds_results(self) -> list[str]:
        """What an earlier run left here that a fresh run would overwrite."""
        # backtest.json: a backtest's fold plan, written before its first fold
        found = [
            p
            for p in ("summary.json", "multirun.yaml", "backtest.json")
            if (self.path / p).exists()
        ]
        found += [p.name for p in self.checkpoints.glob("*.ckpt")]
        found += [p.parent.name for p in self.path.glob("*/*/metrics.csv")]
        return found

    def siblings(self) -> list[RunDir]:
        """Runs beside this one under Hydra's `outputs/<date>/<time>/` (this one included),
        those with saved overrides."""
        root = self.path.resolve().parents[1]
        return [RunDir(m.parent.parent) for m in root.glob("*/*/.hydra/overrides.yaml")]
