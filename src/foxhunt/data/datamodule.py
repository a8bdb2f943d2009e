"""The Parquet LightningDataModule: chronological splits, train-only normalization and
encoder/decoder windows as index arithmetic over contiguous float32 arrays."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from foxhunt.data.loading import (
    Loaded,
    group_names,
    load,
    model_inputs,
    open_dataset,
    resolve_columns,
    resolve_target_kind,
)
from foxhunt.errors import CheckpointError, DataError

log = logging.getLogger(__name__)


@dataclass
class DataSchema:
    """What a model needs to know about its data; stored in every checkpoint."""

    observed: list[str]  # observed-only inputs; the target's history is added in front
    known: list[str]  # known-future inputs
    static: list[str]  # static real inputs
    groups: list[str]  # instrument vocabulary (static categorical); [] for one unnamed series
    target: str
    target_kind: str  # return | level
    encoder_length: int
    prediction_length: int
    # normalization, from the training split (empty until the data module computes it)
    input_mean: list[float] = field(default_factory=list)  # per encoder column
    input_std: list[float] = field(default_factory=list)
    static_mean: list[float] = field(default_factory=list)
    static_std: list[float] = field(default_factory=list)

    @property
    def encoder_columns(self) -> list[str]:
        return [self.target, *self.observed, *self.known]

    @property
    def num_features(self) -> int:
        """Input features taken from the data, the target's own history not counted."""
        return len(self.observed) + len(self.known) + len(self.static)

    @property
    def target_center(self) -> float:
        return self.input_mean[0]

    @property
    def target_scale(self) -> float:
        return self.input_std[0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataSchema:
        return cls(**d)

    def check_matches(self, other: DataSchema) -> None:
        """Raise CheckpointError naming how `other` (the data) differs from this schema."""
        mine = [*self.observed, *self.known, *self.static]
        theirs = [*other.observed, *other.known, *other.static]
        missing = [c for c in mine if c not in theirs]
        extra = [c for c in theirs if c not in mine]
        if missing or extra:
            raise CheckpointError(
                f"the checkpoint was trained on {len(mine)} features, the data has "
                f"{len(theirs)}: missing from the data: {', '.join(missing) or 'none'}; "
                f"extra in the data: {', '.join(extra) or 'none'}"
            )
        for key in (
            "observed",
            "known",
            "static",
            "target",
            "target_kind",
            "encoder_length",
            "prediction_length",
        ):
            if getattr(self, key) != getattr(other, key):
                raise CheckpointError(
                    f"checkpoint and data differ in {key}: "
                    f"{getattr(self, key)!r} (checkpoint) vs {getattr(other, key)!r} (data)"
                )
        new = [g for g in other.groups if g not in self.groups]
        if new:
            raise CheckpointError(f"instruments unknown to the checkpoint: {', '.join(new)}")


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
    ) -> None:
        self.inputs = inputs  # [rows, 1 + observed + known], normalized
        self.known = known  # [rows, known]: the trailing columns of inputs, contiguous
        self.target = target  # [rows], normalized
        self.group = group  # [rows] instrument index
        self.static_real = static_real  # [groups, static]
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


def random_batch(
    schema: DataSchema, batch_size: int, device: Any = "cpu"
) -> dict[str, torch.Tensor]:
    """A batch of `batch_size` windows shaped as WindowDataset delivers them, random values."""
    e, h = schema.encoder_length, schema.prediction_length
    groups = len(schema.groups)
    return {
        "encoder_cont": torch.randn(batch_size, e, len(schema.encoder_columns), device=device),
        "decoder_known": torch.randn(batch_size, h, len(schema.known), device=device),
        "static_cat": torch.zeros(batch_size, 1 if groups else 0, dtype=torch.long, device=device),
        "static_real": torch.randn(batch_size, len(schema.static), device=device),
        "target": torch.randn(batch_size, h, device=device),
        "target_last": torch.randn(batch_size, device=device),
    }


class EpochShuffle(Sampler[int]):
    """A fresh permutation each epoch from (seed, epoch) alone, so a resumed run sees the same
    order as an uninterrupted one; Lightning calls `set_epoch` at every epoch start."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


def _passthrough(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return batch


def ensure_sample(path: str | Path) -> None:
    """Generate the bundled synthetic ES sample at `path` if it is not there yet."""
    p = Path(path)
    if p.exists():
        return
    from foxhunt.data.sample import make_es_sample

    log.info("generating the bundled sample at %s", p)
    make_es_sample(p)


def describe(cfg: Any) -> DataSchema:
    """The configured data's schema from its Parquet footer and group column alone, without
    normalization statistics: enough to size a model (the memory estimator's input)."""
    if cfg.generate_if_missing:
        ensure_sample(cfg.path)
    dataset = open_dataset(cfg.path)
    observed, known, static, target, _ = resolve_columns(dataset.schema, cfg)
    observed, known = model_inputs(cfg, observed, known)
    return DataSchema(
        observed=observed,
        known=known,
        static=static,
        groups=group_names(dataset, cfg.group_column),
        target=target,
        target_kind=resolve_target_kind(cfg),
        encoder_length=cfg.encoder_length,
        prediction_length=cfg.prediction_length,
    )


def _split_starts(n: int, cfg: Any, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Window starts (relative to the series) of each split, and the number of train rows.

    A window's decoder rows lie wholly inside one split; val/test encoders may reach back into
    earlier splits (that is the past, not leakage)."""
    E, H = cfg.encoder_length, cfg.prediction_length
    n_test = int(round(n * cfg.test_fraction))
    n_val = int(round(n * cfg.val_fraction))
    n_train = n - n_val - n_test
    if n_train < E + H:
        raise DataError(
            f"instrument {name} is too short: {n} usable rows leave {n_train} for training, "
            f"one window needs encoder_length + prediction_length = {E + H}"
        )

    def starts(first_decoder: int, end: int) -> np.ndarray:
        return np.arange(max(first_decoder - E, 0), end - E - H + 1, dtype=np.int64)

    return (
        starts(0, n_train),
        starts(n_train, n_train + n_val),
        starts(n_train + n_val, n),
        n_train,
    )


class ParquetDataModule(L.LightningDataModule):
    """Parquet market data as TFT windows; `schema` (from a checkpoint) fixes the normalization."""

    def __init__(self, cfg: Any, schema: DataSchema | None = None, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.seed = seed  # of the training shuffle
        self.batch_size = cfg.batch_size  # the memory policy's batch-size search may change both
        self.val_batch_size = cfg.batch_size
        self.fixed_schema = schema
        self.schema: DataSchema | None = None
        self.datasets: dict[str, WindowDataset] = {}

    def prepare_data(self) -> None:
        if self.cfg.generate_if_missing:
            ensure_sample(self.cfg.path)

    def setup(self, stage: str | None = None) -> None:
        if self.schema is not None:
            return
        self.prepare_data()
        loaded = load(self.cfg)
        self._build(loaded)

    def _build(self, loaded: Loaded) -> None:
        cfg = self.cfg
        series = loaded.series
        splits = [_split_starts(len(s.target), cfg, s.name) for s in series]
        offsets = np.cumsum([0] + [len(s.target) for s in series])[:-1]
        inputs = np.concatenate([np.column_stack([s.target, s.observed, s.known]) for s in series])
        statics = np.stack([s.static for s in series]) if series else np.zeros((0, 0))
        train_rows = np.concatenate(
            [np.arange(o, o + sp[3]) for o, sp in zip(offsets, splits, strict=True)]
        )
        group_names = [s.name for s in series] if cfg.group_column else []
        schema = DataSchema(
            observed=loaded.observed,
            known=loaded.known,
            static=loaded.static,
            groups=group_names,
            target=loaded.target,
            target_kind=loaded.target_kind,
            encoder_length=cfg.encoder_length,
            prediction_length=cfg.prediction_length,
        )
        if self.fixed_schema is not None:
            self.fixed_schema.check_matches(schema)
            schema = dataclasses.replace(self.fixed_schema)
        else:
            mean, std = _mean_std(inputs[train_rows])
            if loaded.target_kind == "return":
                mean[0] = 0.0  # keep the sign of a return: zero stays zero after scaling
            schema.input_mean, schema.input_std = mean.tolist(), std.tolist()
            smean, sstd = _mean_std(statics)
            schema.static_mean, schema.static_std = smean.tolist(), sstd.tolist()

        normalized = (inputs - np.asarray(schema.input_mean)) / np.asarray(schema.input_std)
        inputs_t = torch.from_numpy(normalized.astype(np.float32))
        target_t = inputs_t[:, 0].contiguous()
        known_t = inputs_t[:, inputs_t.shape[1] - len(schema.known) :].contiguous()
        # groups index the checkpoint's vocabulary, so a subset of instruments still embeds right
        vocab = {g: i for i, g in enumerate(schema.groups)}
        group_of_series = [vocab.get(s.name, 0) for s in series]
        group_t = torch.from_numpy(
            np.repeat(group_of_series, [len(s.target) for s in series]).astype(np.int64)
        )
        static_by_group = np.zeros((max(len(schema.groups), 1), len(schema.static)))
        for g, s in zip(group_of_series, series, strict=True):
            static_by_group[g] = (s.static - schema.static_mean) / schema.static_std
        static_t = torch.from_numpy(static_by_group.astype(np.float32))

        for i, split in enumerate(("train", "val", "test")):
            starts = np.concatenate([sp[i] + o for sp, o in zip(splits, offsets, strict=True)])
            if len(starts) == 0 and (split == "train" or _fraction(cfg, split) > 0):
                raise DataError(
                    f"the {split} split has no complete window: increase "
                    f"data.{split}_fraction or shorten data.encoder_length/prediction_length"
                )
            self.datasets[split] = WindowDataset(
                inputs_t,
                target_t,
                group_t,
                static_t,
                known_t,
                starts,
                cfg.encoder_length,
                cfg.prediction_length,
                bool(cfg.group_column),
            )
        self.schema = schema
        log.info(
            "data: %d instruments, %d rows, %d features; windows train/val/test = %d/%d/%d",
            len(series),
            len(inputs),
            schema.num_features,
            *(len(self.datasets[s]) for s in ("train", "val", "test")),
        )

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        dataset = self.datasets[split]
        return DataLoader(
            dataset,
            batch_size=self.batch_size if split == "train" else self.val_batch_size,
            sampler=EpochShuffle(len(dataset), self.seed) if shuffle else None,
            # its own generator: creating an iterator then draws no seed from the global RNG,
            # which dropout uses (and a resumed run must find as an uninterrupted one left it)
            generator=torch.Generator().manual_seed(self.seed),
            num_workers=self.cfg.num_workers,
            collate_fn=_passthrough,
            persistent_workers=self.cfg.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


def _fraction(cfg: Any, split: str) -> float:
    return cfg.val_fraction if split == "val" else cfg.test_fraction


def _mean_std(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if x.size == 0:
        return np.zeros(x.shape[1]), np.ones(x.shape[1])
    mean, std = x.mean(axis=0), x.std(axis=0)
    return mean, np.where(std > 1e-12, std, 1.0)
