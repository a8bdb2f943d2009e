"""The Parquet LightningDataModule: chronological splits, train-only normalization and
encoder/decoder windows (`foxhunt.data.windows`) over contiguous float32 arrays: in memory, or a
disk-backed store built one instrument at a time (data.lazy, `foxhunt.data.store`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from foxhunt_serve import Clock
from torch.utils.data import DataLoader, DistributedSampler

from foxhunt.data import daylight
from foxhunt.data.features import INTRADAY_CALENDAR, clock_of, learned_sessions
from foxhunt.data.names import resolve_data
from foxhunt.data.read import bar_step, read_data, read_end, timeline
from foxhunt.data.schema import DataSchema, constant_features, drop_features
from foxhunt.data.section import DataSection
from foxhunt.data.splits import SPLITS, calendar_cuts, iso_time
from foxhunt.data.store import open_store, wants_lazy
from foxhunt.data.windows import WindowArrays, WindowBuilder, WindowDataset, split_windows
from foxhunt.errors import DataError

log = logging.getLogger(__name__)
DAILY_BAR_NS = 20 * 3600 * 10**9  # a median step this long: daily (or longer) bars


class EpochShuffle(DistributedSampler):
    """A fresh permutation each epoch from (seed, epoch) alone, so a resumed run sees the same
    order as an uninterrupted one; Lightning calls `set_epoch` at every epoch start.

    Under DDP, process `rank` of `world` takes every world-th index of that permutation, padded
    as DistributedSampler pads (the first indices again) so that all take the same number of
    steps: the processes' batches of B together are the single-process batches of world x B.
    (A DistributedSampler subclass, so Lightning does not wrap it in another.)"""

    def __init__(
        self, n: int, seed: int, rank: int = 0, world: int = 1, dates: np.ndarray | None = None
    ) -> None:
        super().__init__(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        self.n = n
        self.skip_epoch, self.skip = -1, 0
        # [n] each window's date (optim.xs_weight): the dates in a fresh order each epoch, each
        # one's windows together in a fresh order, so a batch holds one date's names (#69)
        self.dates = (
            None
            if dates is None
            else torch.from_numpy(np.unique(dates, return_inverse=True)[1].ravel())
        )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, samples: int) -> None:
        """Start `epoch` past its first `samples` indices: a run resumed mid-epoch."""
        self.skip_epoch, self.skip = epoch, samples

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.n, generator=g)
        if self.dates is not None:  # by date, each date's windows as the permutation had them
            date_order = torch.randperm(int(self.dates.max()) + 1, generator=g)
            order = order[torch.sort(date_order[self.dates[order]], stable=True).indices]
        order = torch.cat([order, order[: self.total_size - self.n]])  # padding: < world indices
        order = order[self.rank :: self.num_replicas]
        if self.epoch == self.skip_epoch:
            self.skip_epoch = -1  # only the resumed pass is shortened
            order = order[self.skip :]
        # as a tensor, converted a chunk at a time: a list of every index costs ~36 bytes each
        # (400 MiB at 11 million windows), the tensor 8
        for chunk in order.split(1 << 16):
            yield from chunk.tolist()


class EvalShard(DistributedSampler):
    """Every world-th index from `rank`, in order and without padding: each window is scored
    exactly once across the processes, so the summed metrics are the single-process ones."""

    def __init__(self, n: int, rank: int = 0, world: int = 1) -> None:
        super().__init__(range(n), num_replicas=world, rank=rank, shuffle=False)
        self.indices = range(rank, n, world)

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)


def _passthrough(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return batch


class ParquetDataModule(L.LightningDataModule):
    """Parquet market data as TFT windows; `schema` (from a checkpoint) fixes the normalization."""

    def __init__(
        self, cfg: Any, schema: DataSchema | None = None, seed: int = 0, by_date: bool = False
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.seed = seed  # of the training shuffle
        self.by_date = by_date  # training batches by date (optim.xs_weight; `EpochShuffle`)
        self.batch_size = cfg.batch_size  # the memory policy's batch-size search may change both
        self.val_batch_size = cfg.batch_size
        self.fixed_schema = schema
        self.resume_at: tuple[int, int] | None = None  # (epoch, batches done) from a checkpoint
        self.schema: DataSchema | None = None
        self.datasets: dict[str, WindowDataset] = {}
        self.store_path: Path | None = None  # the lazy path's window store (data.lazy)
        self.section: DataSection | None = None  # how the file is read, once setup resolved it
        self.rolls: list = []  # data.futures: every root's rolls
        self.splits: dict[str, Any] = {}  # the cuts and each instrument's target spans
        # the bars keep another zone's daylight-saving dates (`foxhunt.data.daylight`)
        self.zone_warning: str | None = None
        # what the target's training rows say of it (`foxhunt.data.target`): a return-like
        # column taken as a level, an instrument whose target is constant
        self.target_warnings: list[str] = []

    def prepare_data(self) -> None:
        resolve_data(self.cfg)  # the sample generated; the columns found (foxhunt.data.names)

    def setup(self, stage: str | None = None) -> None:
        if self.schema is not None:
            return
        self.prepare_data()
        clock = clock_of(self.cfg)  # the run's, built once: the reads and the sessions take it
        resolve_intraday(self.cfg, self.fixed_schema, clock)
        if self.fixed_schema is not None and str(self.cfg.target_kind) == "auto":
            self.cfg.target_kind = self.fixed_schema.target_kind  # the kind it was trained as
        if self.fixed_schema is not None:  # and its target as transformed then
            self.cfg.target_transform = self.fixed_schema.target_transform
        self.section = DataSection.of(self.cfg, clock)  # with everything above resolved
        if wants_lazy(self.cfg):  # a disk-backed store built one instrument at a time
            fixed = self.fixed_schema.to_dict() if self.fixed_schema is not None else None
            store = open_store(self.cfg, fixed, self.resolve_schema, self.section)
            self.store_path = store.path
            log.info(
                "data: %s the window store %s", "reusing" if store.reused else "built", store.path
            )
            schema, arrays, self.splits = store.schema, store.arrays, store.splits
            self.rolls, instruments = store.rolls, store.instruments
        else:  # every instrument at once, in memory
            loaded = read_data(self.cfg, self.section)  # first: its checks name the files' faults
            cuts = calendar_cuts(timeline(self.cfg, self.section), self.cfg)
            schema, arrays, self.splits = split_windows(
                loaded, cuts, self.cfg, self.resolve_schema, WindowBuilder()
            )
            self.rolls, instruments = loaded.rolls, len(loaded.series)
        self.zone_warning = daylight.warning(np.asarray(arrays.time_ns), clock)
        self.target_warnings = list(self.splits.get("target_warnings", []))  # (older store: [])
        if self.fixed_schema is None:  # the sessions a short input will not show
            names = arrays.series.names if schema["groups"] else []
            schema["sessions"] = learned_sessions(arrays.time_ns, arrays.group, names, clock)
        self._make_datasets(DataSchema.from_dict(schema), arrays, instruments)

    def resolve_schema(self, found: dict[str, Any], constant: Any) -> dict[str, Any]:
        """The schema to normalize with, from schema dict `found` (every column the data gives,
        train-split statistics) and which of its encoder columns are `constant` over the
        training rows: those dropped, or the checkpoint's schema once the data matches it
        (and without the features its model was trained without)."""
        fixed = self.fixed_schema
        dropped = fixed.dropped if fixed is not None else constant_features(found, constant)
        found = drop_features(found, dropped)[0]
        if fixed is None:
            return found
        fixed.check_matches(DataSchema.from_dict(found))
        return fixed.to_dict() | {"skipped": found["skipped"]}

    def _make_datasets(self, schema: DataSchema, arrays: WindowArrays, instruments: int) -> None:
        cfg = self.cfg
        for split in SPLITS:
            wanted = split == "train" or _fraction(cfg, split) > 0
            if split == "test" and read_end(cfg) is not None:
                wanted = False  # a study's fold: validation only, nothing read beyond it
            if len(arrays.starts[split]) == 0 and wanted:
                cuts = self.splits["cuts"]
                raise DataError(
                    f"the {split} split has no complete window (validation from "
                    f"{cuts['val_start']}, test from {cuts['test_start']}, embargo "
                    f"{cuts['embargo']} bars): move the cuts (data.val_fraction, "
                    "data.test_fraction or data.split.*) or shorten "
                    "data.encoder_length/prediction_length"
                )
        self.datasets = arrays.datasets(
            cfg.encoder_length, cfg.prediction_length, bool(cfg.group_column)
        )
        if getattr(cfg, "calibration_share", 0) and len(self.datasets["val"]):
            self._hold_out(float(cfg.calibration_share))
        self.schema = schema
        for split in SPLITS:
            empty = [n for n, spans in self.splits["instruments"].items() if spans[split] is None]
            if empty and len(empty) < instruments:  # (the whole split empty is said above)
                log.info("data: no %s windows for %s", split, ", ".join(empty))
        if schema.target_transform != "none":
            log.info(
                "data: the target is %s across the names at each time (data.target_transform=%s)",
                "less the mean" if schema.target_transform == "xs_demean" else "ranked",
                getattr(cfg, "target_transform", schema.target_transform),
            )
        if schema.dropped:
            log.info(
                "data: dropped %d feature(s) constant over the training split: %s",
                len(schema.dropped),
                ", ".join(schema.dropped),
            )
        if schema.skipped:
            log.warning(
                "data: skipped by data.features=all: %s",
                ", ".join(f"{c} ({why})" for c, why in schema.skipped.items()),
            )
        log.info(
            "data: %d instruments, %d rows, %d features; windows train/val/test = %d/%d/%d",
            instruments,
            len(arrays.inputs),
            schema.num_features,
            *(len(self.datasets[s]) for s in SPLITS),
        )

    def state_dict(self) -> dict[str, Any]:
        """How far the training epoch got, for a checkpoint written mid-epoch (an interrupt):
        resuming from it skips the batches already trained on (see `EpochShuffle.resume`)."""
        if self.trainer is None:
            return {}
        progress = self.trainer.fit_loop.epoch_loop.batch_progress.current
        return {"epoch": self.trainer.current_epoch, "batches_done": progress.processed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume_at = (state["epoch"], state["batches_done"]) if state else None

    def _loader(self, split: str, shuffle: bool, sharded: bool = True) -> DataLoader:
        """The split's loader; `sharded`: this process's share when the Trainer runs several
        (DDP), else all windows."""
        dataset = self.datasets[split]
        n = len(dataset)
        rank, world = 0, 1
        if sharded and self.trainer is not None:
            rank, world = self.trainer.global_rank, self.trainer.world_size
        if 0 < n < world:
            raise DataError(
                f"the {split} split has {n} windows for {world} processes (each needs one): "
                f"increase data.{split}_fraction or use fewer trainer.devices"
            )
        return DataLoader(
            dataset,
            batch_size=self.batch_size if split == "train" else self.val_batch_size,
            sampler=EpochShuffle(n, self.seed, rank, world, self._dates(dataset))
            if shuffle
            else EvalShard(n, rank, world),
            # its own generator: creating an iterator then draws no seed from the global RNG,
            # which dropout uses (and a resumed run must find as an uninterrupted one left it)
            generator=torch.Generator().manual_seed(self.seed),
            num_workers=self.cfg.num_workers,
            collate_fn=_passthrough,
            persistent_workers=self.cfg.num_workers > 0,
        )

    def _dates(self, dataset: WindowDataset) -> np.ndarray | None:
        """The training windows' origins (their encoders' last times), where batches go by date
        (`by_date`)."""
        if not self.by_date or dataset.time_ns is None:
            return None
        return dataset.time_ns[dataset.starts + len(dataset.enc_offsets) - 1].numpy()

    def _hold_out(self, share: float) -> None:
        """The validation windows whose first target falls in the last `share` of the
        validation period's target times become the calibration windows
        (datasets["calibration"]); validation, which stops training and picks the checkpoint,
        keeps those whose every target lies before the first of them. The windows between,
        whose targets straddle the cut (prediction_length - 1 bars of a gapless series), are
        the embargo: no validation target falls in the calibration period, whatever an
        instrument's history (a late listing, a gap)."""
        val = self.datasets["val"]
        targets = val.target_times(np.arange(len(val)))
        first, last = targets[:, 0], targets[:, -1]
        times = np.unique(first)
        cut = times[min(len(times) - 1, int(np.floor(len(times) * (1 - share))))]
        keep = last < cut
        if not keep.any():
            raise DataError(
                f"data.calibration_share={share} leaves no validation window to stop on: "
                "lower it or raise data.val_fraction"
            )
        self.datasets["calibration"] = val.subset(first >= cut)
        self.datasets["val"] = val.subset(keep)
        self.splits["cuts"]["calibration_start"] = iso_time(int(cut))
        log.info(
            "data: %d validation windows, %d calibration windows (targets from %s on), "
            "%d embargoed between them",
            len(self.datasets["val"]),
            len(self.datasets["calibration"]),
            iso_time(int(cut)),
            int((~keep & (first < cut)).sum()),
        )

    def train_dataloader(self) -> DataLoader:
        loader = self._loader("train", shuffle=True)
        if self.resume_at is not None:  # restored from a checkpoint written mid-epoch
            epoch, batches_done = self.resume_at
            loader.sampler.resume(epoch, batches_done * self.batch_size)
        return loader

    def val_dataloader(self, sharded: bool = True) -> DataLoader:
        return self._loader("val", shuffle=False, sharded=sharded)

    def test_dataloader(self, sharded: bool = True) -> DataLoader:
        return self._loader("test", shuffle=False, sharded=sharded)

    def calibration_dataloader(self, sharded: bool = False) -> DataLoader:
        """The windows the conformal calibration is fitted on: data.calibration_share's held
        out ones, else the validation windows."""
        split = "calibration" if "calibration" in self.datasets else "val"
        return self._loader(split, shuffle=False, sharded=sharded)


def _fraction(cfg: Any, split: str) -> float:
    return cfg.val_fraction if split == "val" else cfg.test_fraction


def resolve_intraday(
    cfg: Any, schema: DataSchema | None = None, clock: Clock | None = None
) -> None:
    """data.ohlcv.intraday=auto, resolved in `cfg`: as `schema` (a checkpoint's) has it, else
    from the median bar step of the data's first file (daily bars or longer: no time-of-day
    features). A file whose times cannot be read is left to `read_data` to name what is wrong."""
    if cfg.features != "ohlcv" or getattr(cfg.ohlcv, "intraday", None) != "auto":
        return
    if schema is not None:
        known = {*schema.known, *schema.dropped}
        cfg.ohlcv.intraday = INTRADAY_CALENDAR[0] in known or not {"dow_sin", "dow_cos"} <= known
        return
    try:
        step = bar_step(
            cfg, clock or clock_of(cfg)
        )  # one file's times: a cached window store is not read again
    except DataError:
        return
    cfg.ohlcv.intraday = step is None or step < DAILY_BAR_NS
    if not cfg.ohlcv.intraday:
        log.info("data: daily bars, so no time-of-day features (%s)", ", ".join(INTRADAY_CALENDAR))
