"""The Parquet LightningDataModule: chronological splits, train-only normalization and
encoder/decoder windows as index arithmetic over contiguous float32 arrays: in memory, or a
disk-backed store built one instrument at a time (data.lazy, `foxhunt.data.store`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from foxhunt.data.features import INTRADAY_CALENDAR
from foxhunt.data.read import Loaded, bar_step, load, timeline
from foxhunt.data.schema import DataSchema, constant_features, drop_features, found_schema
from foxhunt.data.source import ensure_sample
from foxhunt.data.splits import (
    SPLITS,
    Cuts,
    as_float32,
    calendar_cuts,
    check_normalized,
    mean_std,
    normalized_statics,
    split_record,
    split_starts,
)
from foxhunt.data.store import open_store, wants_lazy
from foxhunt.errors import DataError

log = logging.getLogger(__name__)
DAILY_BAR_NS = 20 * 3600 * 10**9  # a median step this long: daily (or longer) bars


class WindowDataset(Dataset):
    """Windows of `encoder_length + prediction_length` rows starting at `starts`.

    `__getitems__` builds a whole batch with one gather per tensor; the DataLoader then only
    passes it through (`collate=_passthrough`)."""

    def __init__(
        self,
        inputs: torch.Tensor,
        target: torch.Tensor,
        group: torch.Tensor,
        static_real: torch.Tensor,
        known: torch.Tensor,
        starts: np.ndarray,
        encoder_length: int,
        prediction_length: int,
        has_groups: bool,
        time_ns: torch.Tensor | None = None,
    ) -> None:
        self.inputs = inputs  # [rows, 1 + observed + known], normalized
        self.known = known  # [rows, known]: the trailing columns of inputs, contiguous
        self.target = target  # [rows], normalized
        self.group = group  # [rows] instrument index
        self.static_real = static_real  # [groups, static]
        # [rows] int64 ns UTC: for the baselines (foxhunt.evaluation), never in a batch
        self.time_ns = time_ns
        self.starts = torch.from_numpy(starts)
        self.enc_offsets = torch.arange(encoder_length)
        self.dec_offsets = torch.arange(encoder_length, encoder_length + prediction_length)
        self.has_groups = has_groups

    def __len__(self) -> int:
        return len(self.starts)

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        s = self.starts[torch.as_tensor(indices)]
        enc = s[:, None] + self.enc_offsets
        dec = s[:, None] + self.dec_offsets
        group = self.group[s]
        return {
            "encoder_cont": self.inputs[enc],
            "decoder_known": self.known[dec],
            "static_cat": group[:, None] if self.has_groups else group[:, None][:, :0],
            "static_real": self.static_real[group],
            "target": self.target[dec],
            "target_last": self.target[enc[:, -1]],
            "index": s,  # the window's first row: which sample this is
        }

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    def target_times(self, indices: np.ndarray) -> np.ndarray:
        """The target (decoder) rows' times [len(indices), prediction_length], int64 ns UTC."""
        if self.time_ns is None:
            raise ValueError("these windows were built without their times")
        return self.time_ns[
            self.starts[torch.as_tensor(indices)][:, None] + self.dec_offsets
        ].numpy()


def window_tensors(
    rows: np.ndarray,
    schema: DataSchema,
    instrument_of: Callable[[int], str | None] = lambda row: None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 encoder rows [rows, 1 + observed + known] normalized with the schema's statistics:
    the float32 inputs, target (column 0) and known (trailing columns) that WindowDataset takes.
    A DataError names the column (and `instrument_of(row)`) where one is not finite."""
    mean, std = schema.input_mean, schema.input_std
    normalized = as_float32((rows - np.asarray(mean)) / np.asarray(std))
    check_normalized(normalized, schema.encoder_columns, mean, std, instrument_of)
    inputs = torch.from_numpy(normalized)
    known = inputs[:, inputs.shape[1] - len(schema.known) :].contiguous()
    return inputs, inputs[:, 0].contiguous(), known


class EpochShuffle(DistributedSampler):
    """A fresh permutation each epoch from (seed, epoch) alone, so a resumed run sees the same
    order as an uninterrupted one; Lightning calls `set_epoch` at every epoch start.

    Under DDP, process `rank` of `world` takes every world-th index of that permutation, padded
    as DistributedSampler pads (the first indices again) so that all take the same number of
    steps: the processes' batches of B together are the single-process batches of world x B.
    (A DistributedSampler subclass, so Lightning does not wrap it in another.)"""

    def __init__(self, n: int, seed: int, rank: int = 0, world: int = 1) -> None:
        super().__init__(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        self.n = n
        self.skip_epoch, self.skip = -1, 0

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

    def __init__(self, cfg: Any, schema: DataSchema | None = None, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.seed = seed  # of the training shuffle
        self.batch_size = cfg.batch_size  # the memory policy's batch-size search may change both
        self.val_batch_size = cfg.batch_size
        self.fixed_schema = schema
        self.resume_at: tuple[int, int] | None = None  # (epoch, batches done) from a checkpoint
        self.schema: DataSchema | None = None
        self.datasets: dict[str, WindowDataset] = {}
        self.store_path: Path | None = None  # the lazy path's window store (data.lazy)
        self.rolls: list = []  # data.futures: every root's rolls
        self.splits: dict[str, Any] = {}  # the cuts and each instrument's target spans

    def prepare_data(self) -> None:
        if self.cfg.generate_if_missing:
            ensure_sample(self.cfg.path)

    def setup(self, stage: str | None = None) -> None:
        if self.schema is not None:
            return
        self.prepare_data()
        resolve_intraday(self.cfg, self.fixed_schema)
        if wants_lazy(self.cfg):
            self._build_lazy()
        else:
            loaded = load(self.cfg)  # first: its checks name what is wrong with the files
            self._build(loaded, calendar_cuts(timeline(self.cfg), self.cfg))

    def _build(self, loaded: Loaded, cuts: Cuts) -> None:
        """The in-memory path: every instrument at once, normalized into one tensor."""
        cfg = self.cfg
        self.rolls = loaded.rolls  # data.futures: every root's rolls (rolls.csv)
        series = list(loaded.series)
        E, H = cfg.encoder_length, cfg.prediction_length
        splits = [split_starts(s.time_ns, cuts, E, H) for s in series]
        self.splits = split_record(cuts, series, splits, E, H)
        offsets = np.cumsum([0] + [len(s.target) for s in series])[:-1]
        inputs = np.concatenate([np.column_stack([s.target, s.observed, s.known]) for s in series])
        statics = np.stack([s.static for s in series]) if series else np.zeros((0, 0))
        train_rows = np.concatenate(
            [
                np.arange(o + sp[3].start, o + sp[3].stop)
                for o, sp in zip(offsets, splits, strict=True)
            ]
        )
        train = inputs[train_rows]
        names = [s.name for s in series]
        found = found_schema(loaded, cfg, names, *mean_std(train), statics)
        constant = np.zeros(inputs.shape[1], bool)
        if len(train):
            constant = train.min(axis=0) == train.max(axis=0)
        schema = DataSchema.from_dict(self.resolve_schema(found, constant))
        inputs = inputs[:, drop_features(found, schema.dropped)[1]]

        def instrument_of(row: int) -> str:
            return series[int(np.searchsorted(offsets, row, side="right")) - 1].name

        inputs_t, target_t, known_t = window_tensors(inputs, schema, instrument_of)
        group_of_series, static_by_group = normalized_statics(
            schema.to_dict(), [s.name for s in series], [s.static for s in series]
        )
        group_t = torch.from_numpy(np.repeat(group_of_series, [len(s.target) for s in series]))
        time_t = torch.from_numpy(np.concatenate([s.time_ns for s in series]).astype(np.int64))
        static_t = torch.from_numpy(static_by_group.astype(np.float32))
        starts = {
            split: np.concatenate([sp[i] + o for sp, o in zip(splits, offsets, strict=True)])
            for i, split in enumerate(SPLITS)
        }
        self._make_datasets(
            schema, inputs_t, target_t, known_t, group_t, static_t, time_t, starts, len(series)
        )

    def _build_lazy(self) -> None:
        """The lazy path: a disk-backed store built one instrument at a time (`data.store`)."""

        fixed = self.fixed_schema.to_dict() if self.fixed_schema is not None else None
        store = open_store(self.cfg, fixed, self.resolve_schema)
        self.store_path = store.path
        self.rolls = store.rolls
        log.info("data: %s the window store %s", "reusing" if store.reused else "built", store.path)
        inputs, target, known, group, static, time_ns = (
            torch.from_numpy(a)
            for a in (
                store.inputs,
                store.target,
                store.known,
                store.group,
                store.static,
                store.time_ns,
            )
        )
        schema = DataSchema.from_dict(store.schema)
        self.splits = store.splits
        self._make_datasets(
            schema, inputs, target, known, group, static, time_ns, store.starts, store.instruments
        )

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

    def _make_datasets(
        self,
        schema: DataSchema,
        inputs: torch.Tensor,
        target: torch.Tensor,
        known: torch.Tensor,
        group: torch.Tensor,
        static: torch.Tensor,
        time_ns: torch.Tensor,
        starts: dict[str, np.ndarray],
        instruments: int,
    ) -> None:
        cfg = self.cfg
        for split in SPLITS:
            if len(starts[split]) == 0 and (split == "train" or _fraction(cfg, split) > 0):
                cuts = self.splits["cuts"]
                raise DataError(
                    f"the {split} split has no complete window (validation from "
                    f"{cuts['val_start']}, test from {cuts['test_start']}, embargo "
                    f"{cuts['embargo']} bars): move the cuts (data.val_fraction, "
                    "data.test_fraction or data.split.*) or shorten "
                    "data.encoder_length/prediction_length"
                )
            self.datasets[split] = WindowDataset(
                inputs,
                target,
                group,
                static,
                known,
                starts[split],
                cfg.encoder_length,
                cfg.prediction_length,
                bool(cfg.group_column),
                time_ns,
            )
        self.schema = schema
        for split in SPLITS:
            empty = [n for n, spans in self.splits["instruments"].items() if spans[split] is None]
            if empty and len(empty) < instruments:  # (the whole split empty is said above)
                log.info("data: no %s windows for %s", split, ", ".join(empty))
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
            len(inputs),
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
            sampler=EpochShuffle(n, self.seed, rank, world)
            if shuffle
            else EvalShard(n, rank, world),
            # its own generator: creating an iterator then draws no seed from the global RNG,
            # which dropout uses (and a resumed run must find as an uninterrupted one left it)
            generator=torch.Generator().manual_seed(self.seed),
            num_workers=self.cfg.num_workers,
            collate_fn=_passthrough,
            persistent_workers=self.cfg.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        loader = self._loader("train", shuffle=True)
        if self.resume_at is not None:  # restored from a checkpoint written mid-epoch
            epoch, batches_done = self.resume_at
            loader.sampler.resume(epoch, batches_done * self.batch_size)
        return loader

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self, sharded: bool = True) -> DataLoader:
        return self._loader("test", shuffle=False, sharded=sharded)


def _fraction(cfg: Any, split: str) -> float:
    return cfg.val_fraction if split == "val" else cfg.test_fraction


def resolve_intraday(cfg: Any, schema: DataSchema | None = None) -> None:
    """data.ohlcv.intraday=auto, resolved in `cfg`: as `schema` (a checkpoint's) has it, else
    from the median bar step of the data's first file (daily bars or longer: no time-of-day
    features). A file whose times cannot be read is left to `load` to name what is wrong."""
    if cfg.features != "ohlcv" or getattr(cfg.ohlcv, "intraday", None) != "auto":
        return
    if schema is not None:
        known = {*schema.known, *schema.dropped}
        cfg.ohlcv.intraday = INTRADAY_CALENDAR[0] in known or not {"dow_sin", "dow_cos"} <= known
        return
    try:
        step = bar_step(cfg)  # one file's times: a cached window store is not read again
    except DataError:
        return
    cfg.ohlcv.intraday = step is None or step < DAILY_BAR_NS
    if not cfg.ohlcv.intraday:
        log.info("data: daily bars, so no time-of-day features (%s)", ", ".join(INTRADAY_CALENDAR))
