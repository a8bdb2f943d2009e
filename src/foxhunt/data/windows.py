"""Encoder/decoder windows as index arithmetic over contiguous float32 rows, built one way for
every path that cuts them: the data module's in-memory path, its disk-backed window store
(`foxhunt.data.store`) and predict (`foxhunt.app.predict.predictor`).

A `WindowBuilder` takes one instrument at a time: its float64 encoder rows (the target, then
the observed and known inputs: `encoder_rows`; predict adds the rows after the data), their
times, its window starts in each split (numbered in its own rows: offset here by the rows added
before it) and its static reals. Once the schema is known, `normalize` makes of them the float32
arrays that `WindowDataset` indexes (`WindowArrays`), with one float64 formula and then the cast
(`normalized_inputs`), so that every path gives the same numbers. A `DiskWindowBuilder` writes
the rows to a folder as they come (with the training rows' moments merged block by block,
`splits.Moments`) and normalizes them a chunk at a time, so that memory holds one instrument or
one chunk; its folder then holds

    inputs.f32   [rows, 1 + observed + known]  normalized, the target first
    target.f32   [rows]                        column 0 of inputs, contiguous
    known.f32    [rows, known]                 the trailing columns of inputs, contiguous
    group.i64    [rows]                        its series: the index of its name in meta.json
    time.i64     [rows]                        each row's time, int64 ns UTC (for the baselines)
    raw.f64      [rows]                        the target before data.target_transform, in its
                                               units (only under a transform)
    static.npy   [series, static]              normalized static reals (and target scale)
    train.i64, val.i64, test.i64               window starts of each split

`split_windows` is the data module's use of either: the chronological splits, the training rows'
statistics, the schema made of them and the rows normalized with it."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from foxhunt_serve import moments, normalize_rows
from torch.utils.data import Dataset

from foxhunt.data import panel_inputs
from foxhunt.data.read import Loaded, Series
from foxhunt.data.schema import DataSchema, drop_features, found_schema
from foxhunt.data.splits import (
    SPLITS,
    Cuts,
    Moments,
    embedding_rows,
    mean_std,
    normalized_statics,
    split_record,
    split_starts,
    vocabulary_index,
)
from foxhunt.data.target import evidence, target_kind

CHUNK_BYTES = 16 * 2**20  # float64 rows a DiskWindowBuilder normalizes at a time
# the schema to normalize with, from the one the data gives (train-split statistics) and which
# of its encoder columns are constant over the training rows (ParquetDataModule.resolve_schema)
Resolve = Callable[[dict[str, Any], np.ndarray], dict[str, Any]]


@dataclass
class PerSeries:
    """What each series of the windows is, by its index (the `group` of its rows), looked up by
    its name: a name the model was not trained on gets its own statics, the pooled target
    scale and the embedding's row past the vocabulary (`by_name`)."""

    names: list[str | None]  # [series] (None: one unnamed series)
    embed: np.ndarray  # [series] int64: the row of the instrument embedding
    static: np.ndarray  # [series, static] float32: normalized static reals
    centre: np.ndarray  # [series] float64: the target's centre in its units
    scale: np.ndarray  # [series] float64: and its scale

    def unseen(self, vocabulary: list[str]) -> list[int]:
        """The series forecast as names the model has not seen: the embedding's row after its
        `vocabulary` (a name outside it, or without a training window); none for one series."""
        return [i for i, row in enumerate(self.embed) if vocabulary and row == len(vocabulary)]


def by_name(schema: dict[str, Any], names: list[str | None], static: np.ndarray) -> PerSeries:
    """The series `names`, with their normalized static reals `static`, looked up in schema
    dict `schema`."""
    centre, scale = DataSchema.from_dict(schema).target_of(vocabulary_index(schema, names))
    return PerSeries(list(names), embedding_rows(schema, names), static, centre, scale)


class WindowDataset(Dataset):
    """Windows of `encoder_length + prediction_length` rows starting at `starts`.

    `__getitems__` builds a whole batch with one gather per tensor; the DataLoader then only
    passes it through (`collate=_passthrough`)."""

    def __init__(
        self,
        inputs: torch.Tensor,
        target: torch.Tensor,
        group: torch.Tensor,
        series: PerSeries,
        known: torch.Tensor,
        starts: np.ndarray,
        encoder_length: int,
        prediction_length: int,
        has_groups: bool,
        time_ns: torch.Tensor | None = None,
        raw_target: np.ndarray | None = None,
    ) -> None:
        self.inputs = inputs  # [rows, 1 + observed + known], normalized
        self.known = known  # [rows, known]: the trailing columns of inputs, contiguous
        self.target = target  # [rows], normalized
        self.group = group  # [rows] the series (`series`) of each row
        self.series = series
        self.static_real = torch.from_numpy(series.static)  # [series, static]
        self.embed = torch.from_numpy(series.embed)  # [series]
        # [series] each one's target scale in its own units (metrics in the target's units)
        self.target_scale = torch.from_numpy(series.scale.astype(np.float32))
        # [rows] int64 ns UTC: for the baselines (foxhunt.evaluation); a batch's `origin`
        self.time_ns = time_ns
        # [rows] float64 in the target's units: the target before data.target_transform, for
        # the forecast table's raw `actual` (None: the target is raw), never in a batch
        self.raw_target = raw_target
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
        embed = self.embed[group][:, None]
        return {
            "encoder_cont": self.inputs[enc],
            "decoder_known": self.known[dec],
            "static_cat": embed if self.has_groups else embed[:, :0],
            "static_real": self.static_real[group],
            "target": self.target[dec],
            "target_last": self.target[enc[:, -1]],
            "target_scale": self.target_scale[group],  # for metrics in the target's units
            "index": s,  # the window's first row: which sample this is
        } | ({} if self.time_ns is None else {"origin": self.time_ns[enc[:, -1]]})

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    def subset(self, keep: np.ndarray) -> WindowDataset:
        """The windows where `keep` [len(self)] is True, indexing the same tensors."""
        out = copy.copy(self)
        out.starts = self.starts[torch.from_numpy(np.asarray(keep, dtype=bool))]
        return out

    def window_series(self) -> np.ndarray:
        """[len(self)] int64: each window's series (its index in `series`)."""
        return self.group[self.starts].numpy()

    def target_times(self, indices: np.ndarray) -> np.ndarray:
        """The target (decoder) rows' times [len(indices), prediction_length], int64 ns UTC."""
        if self.time_ns is None:
            raise ValueError("these windows were built without their times")
        return self.time_ns[
            self.starts[torch.as_tensor(indices)][:, None] + self.dec_offsets
        ].numpy()


@dataclass
class WindowArrays:
    """What `WindowDataset` indexes, as numpy arrays: in memory, or a window store's memmaps."""

    inputs: np.ndarray  # [rows, 1 + observed + known] float32, normalized, the target first
    target: np.ndarray  # [rows] float32: column 0 of inputs, contiguous
    known: np.ndarray  # [rows, known] float32: the trailing columns of inputs, contiguous
    group: np.ndarray  # [rows] int64: the series of each row (its index in `series`)
    series: PerSeries
    time_ns: np.ndarray  # [rows] int64 ns UTC
    starts: dict[str, np.ndarray]  # each split's window starts (int64 rows)
    # [rows] float64: the target before data.target_transform, in its units (None: none applied)
    raw_target: np.ndarray | None = None

    def datasets(
        self, encoder_length: int, prediction_length: int, has_groups: bool
    ) -> dict[str, WindowDataset]:
        """One WindowDataset per split, all of them indexing the same tensors."""
        inputs, target, known, group, time_ns = (
            torch.from_numpy(a)
            for a in (self.inputs, self.target, self.known, self.group, self.time_ns)
        )
        return {
            split: WindowDataset(
                inputs,
                target,
                group,
                self.series,
                known,
                starts,
                encoder_length,
                prediction_length,
                has_groups,
                time_ns,
                self.raw_target,
            )
            for split, starts in self.starts.items()
        }


def encoder_rows(s: Series) -> np.ndarray:
    """An instrument's float64 encoder rows [rows, 1 + observed + known], the target first."""
    return np.column_stack([s.target, s.observed, s.known])


def normalized_inputs(
    rows: np.ndarray,
    schema: dict[str, Any],
    centre: np.ndarray,
    scale: np.ndarray,
    instrument_of: Callable[[int], str | None],
) -> np.ndarray:
    """Float64 rows of schema dict `schema`'s encoder columns, normalized in place with its
    statistics (the target's with each row's instrument's `centre` and `scale`), as
    float32. A DataError names the column (and the instrument of `instrument_of(row)`) where
    one is not finite."""
    columns = [schema["target"], *schema["observed"], *schema["known"]]
    # each instrument on its own scale (foxhunt_serve.scaling), or every one on the pooled
    target = (centre, scale) if schema.get("target_scales") else None
    mean, std = schema["input_mean"], schema["input_std"]
    return normalize_rows(rows, mean, std, columns, target, instrument_of)


class WindowBuilder:
    """Instruments' rows and window starts, added one instrument at a time and held in memory;
    `normalize` turns them into the arrays WindowDataset indexes."""

    def __init__(self, splits: Sequence[str] = SPLITS) -> None:
        self.splits = tuple(splits)
        self.names: list[str] = []  # the instruments, in the order added
        self.statics: list[np.ndarray] = []  # their static reals, float64
        self.lengths: list[int] = []  # their rows
        self.counts = dict.fromkeys(self.splits, 0)  # the windows of each split
        self.rows = 0
        self._rows: list[np.ndarray] = []
        self._times: list[np.ndarray] = []
        self._raw: list[np.ndarray | None] = []  # each one's target before its transform
        self._starts: dict[str, list[np.ndarray]] = {s: [] for s in self.splits}
        self._train: list[slice] = []

    def add(
        self,
        name: str,
        rows: np.ndarray,
        time_ns: np.ndarray,
        starts: Sequence[np.ndarray],
        static: np.ndarray,
        train: slice = slice(0, 0),
        raw: np.ndarray | None = None,
    ) -> None:
        """Instrument `name`: its float64 encoder rows (`encoder_rows`) and their int64 times,
        its window starts in each split (numbered in its own rows) and its static reals;
        `train`: its rows whose statistics normalize (`statistics`); `raw`: its target before
        data.target_transform, a value a row (None: the target is raw)."""
        offset = dict(zip(self.splits, (st + self.rows for st in starts), strict=True))
        self._keep(rows, time_ns.astype(np.int64, copy=False), offset, train, raw)
        for split, st in offset.items():
            self.counts[split] += len(st)
        self.names.append(name)
        self.statics.append(static)
        self.lengths.append(len(rows))
        self.rows += len(rows)

    def _keep(
        self,
        rows: np.ndarray,
        time_ns: np.ndarray,
        starts: dict[str, np.ndarray],
        train: slice,
        raw: np.ndarray | None,
    ) -> None:
        self._rows.append(rows)
        self._times.append(time_ns)
        self._raw.append(raw)
        for split, st in starts.items():
            self._starts[split].append(st)
        self._train.append(slice(self.rows + train.start, self.rows + train.stop))

    def _inputs(self) -> np.ndarray:
        """Every row added, one float64 array."""
        if len(self._rows) != 1:
            self._rows = [np.concatenate(self._rows)]
        return self._rows[0]

    def statistics(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The training rows' per-column mean and std (`splits.mean_std`), and which columns
        are constant over them (none without training rows)."""
        inputs = self._inputs()
        train = np.concatenate([inputs[rows] for rows in self._train])
        constant = np.zeros(inputs.shape[1], bool)
        if len(train):
            constant = train.min(axis=0) == train.max(axis=0)
        return (*mean_std(train), constant)

    def normalize(self, schema: dict[str, Any], keep: list[int]) -> WindowArrays:
        """The rows normalized with schema dict `schema` (of each row its encoder columns
        `keep`: the schema's, without the features it drops), and what each series is in it
        (`by_name`)."""
        static = normalized_statics(schema, self.names, self.statics).astype(np.float32)
        return self._normalized(schema, keep, by_name(schema, self.names, static))

    def _normalized(
        self, schema: dict[str, Any], keep: list[int], series: PerSeries
    ) -> WindowArrays:
        rows = self._inputs()[:, keep]
        self._rows = []  # the float64 rows of every column: no longer needed
        offsets = np.cumsum([0, *self.lengths])[:-1]

        def instrument_of(row: int) -> str:
            return self.names[int(np.searchsorted(offsets, row, side="right")) - 1]

        group = np.repeat(np.arange(len(self.names)), self.lengths)
        centre, scale = series.centre[group], series.scale[group]
        inputs = normalized_inputs(rows, schema, centre, scale, instrument_of)
        return WindowArrays(
            inputs=inputs,
            target=np.ascontiguousarray(inputs[:, 0]),
            known=np.ascontiguousarray(inputs[:, inputs.shape[1] - len(schema["known"]) :]),
            group=group,
            series=series,
            time_ns=np.concatenate(self._times),
            starts={split: np.concatenate(st) for split, st in self._starts.items()},
            raw_target=raw_rows(self._raw, self.lengths),
        )


def raw_rows(raw: list[np.ndarray | None], lengths: list[int]) -> np.ndarray | None:
    """Every series' target before data.target_transform (`raw`, each one's or None, of
    `lengths` rows) as one float64 array: None where no series has one, NaN for one without."""
    if all(r is None for r in raw):
        return None
    return np.concatenate(
        [np.full(n, np.nan) if r is None else r for r, n in zip(raw, lengths, strict=True)]
    ).astype(np.float64, copy=False)


class DiskWindowBuilder(WindowBuilder):
    """A WindowBuilder that writes to `folder` (the files of the module docstring): the float64
    rows to a scratch file as they are added, then normalized a chunk at a time with plain
    reads and writes (a memmap would count every page it touched as resident)."""

    def __init__(self, folder: Path, splits: Sequence[str] = SPLITS) -> None:
        super().__init__(splits)
        self.folder = folder
        self._moments: Moments | None = None  # of the training rows

    def _keep(
        self,
        rows: np.ndarray,
        time_ns: np.ndarray,
        starts: dict[str, np.ndarray],
        train: slice,
        raw: np.ndarray | None,
    ) -> None:
        if self._moments is None:
            self._moments = Moments(rows.shape[1])
        self._moments.add(rows[train])
        self._append("inputs.f64", rows)
        self._append("ordinal.i64", np.full(len(rows), len(self.names), np.int64))
        self._append("time.i64", time_ns)
        if raw is not None:  # a transform applies to every series or none
            self._append("raw.f64", np.asarray(raw, np.float64))
        for split, st in starts.items():
            self._append(f"{split}.i64", st)

    def _append(self, name: str, values: np.ndarray) -> None:
        with open(self.folder / name, "ab") as f:
            values.tofile(f)

    def statistics(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        moments = self._moments or Moments(0)
        return (*moments.mean_std(), moments.constant())

    def _normalized(
        self, schema: dict[str, Any], keep: list[int], series: PerSeries
    ) -> WindowArrays:
        np.save(self.folder / "static.npy", series.static)
        scratch, ordinals = self.folder / "inputs.f64", self.folder / "ordinal.i64"
        width = len(self._moments.mean)
        known = len(schema["known"])
        chunk_rows = max(1, CHUNK_BYTES // (8 * width))
        with (
            open(scratch, "rb") as scratch_f,
            open(ordinals, "rb") as ordinal_f,
            open(self.folder / "inputs.f32", "wb") as inputs_f,
            open(self.folder / "target.f32", "wb") as target_f,
            open(self.folder / "known.f32", "wb") as known_f,
            open(self.folder / "group.i64", "wb") as group_f,
        ):
            while True:
                block = np.fromfile(scratch_f, np.float64, count=chunk_rows * width)
                if block.size == 0:
                    break
                ordinal = np.fromfile(ordinal_f, np.int64, count=block.size // width)
                rows = block.reshape(-1, width)[:, keep]

                def instrument_of(row: int) -> str:
                    return self.names[ordinal[row]]  # noqa: B023 - called before the next chunk

                centre, scale = series.centre[ordinal], series.scale[ordinal]
                inputs = normalized_inputs(rows, schema, centre, scale, instrument_of)
                inputs.tofile(inputs_f)
                np.ascontiguousarray(inputs[:, 0]).tofile(target_f)
                np.ascontiguousarray(inputs[:, len(keep) - known :]).tofile(known_f)
                ordinal.tofile(group_f)
        scratch.unlink()
        ordinals.unlink()
        return on_disk(self.folder, self.rows, len(keep), known, self.counts, schema, self.names)


def _memmap(path: Path, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype)
    # copy-on-write: writable for torch.from_numpy, and nothing can change the file
    return np.memmap(path, dtype=dtype, mode="c", shape=shape)


def on_disk(
    folder: Path,
    rows: int,
    columns: int,
    known: int,
    counts: dict[str, int],
    schema: dict,
    names: list[str | None],
) -> WindowArrays:
    """The arrays a DiskWindowBuilder wrote to `folder` (`rows` of `columns` encoder columns,
    `known` of them known inputs; `counts` windows of each split; normalized with schema dict
    `schema`; the series `names`), as memmaps."""
    raw = folder / "raw.f64"  # written under a data.target_transform only
    return WindowArrays(
        inputs=_memmap(folder / "inputs.f32", np.float32, (rows, columns)),
        target=_memmap(folder / "target.f32", np.float32, (rows,)),
        known=_memmap(folder / "known.f32", np.float32, (rows, known)),
        group=_memmap(folder / "group.i64", np.int64, (rows,)),
        series=by_name(schema, names, np.load(folder / "static.npy")),
        time_ns=_memmap(folder / "time.i64", np.int64, (rows,)),
        starts={s: _memmap(folder / f"{s}.i64", np.int64, (n,)) for s, n in counts.items()},
        raw_target=_memmap(raw, np.float64, (rows,)) if raw.exists() else None,
    )


def split_windows(
    loaded: Loaded, cuts: Cuts, cfg: Any, resolve: Resolve, builder: WindowBuilder
) -> tuple[dict[str, Any], WindowArrays, dict[str, Any]]:
    """The data module's windows, in memory or on disk (`builder`): each instrument's window
    starts in the train, val and test periods of `cuts`; the schema dict `resolve` makes of the
    one the data gives (with the training rows' statistics and the target's kind they show,
    `foxhunt.data.target`); the rows normalized with it; and what summary.json records of the
    splits (`splits.split_record`) with the warnings the target's training rows give."""
    E, H = cfg.encoder_length, cfg.prediction_length
    spans: dict[str, Any] = {}
    # each instrument's training targets' moments as either kind (foxhunt_serve.scaling), and
    # what they say of the target (foxhunt.data.target), read as the instruments stream by
    target_moments: dict[str, list] = {"return": [], "level": []}
    found_evidence, untrained = [], []  # untrained: the names without a training window
    configured = str(getattr(cfg, "target_kind", "auto"))
    judged = None  # (kind, warnings) where data.target_transform waits for the kind
    if loaded.target_transform == panel_inputs.PENDING:  # (every series in memory)
        raw = [
            evidence(s.name, s.target[split_starts(s.time_ns, cuts, E, H)[-1]])
            for s in loaded.series
        ]
        judged = target_kind(configured, loaded.target_kind, loaded.target, raw)
        loaded = panel_inputs.settle(dataclasses.replace(loaded, target_kind=judged[0]), cfg)
    for s in loaded.series:
        *starts, train = split_starts(s.time_ns, cuts, E, H)
        if not len(starts[0]):
            untrained.append(s.name)
        spans |= split_record(cuts, [s], [starts], E, H)["instruments"]
        found_evidence.append(evidence(s.name, s.target[train]))
        for kind, found_moments in target_moments.items():
            found_moments.append(moments(s.target[train], kind, s.target[:1]))
        builder.add(s.name, encoder_rows(s), s.time_ns, starts, s.static, train, s.raw_target)
    kind, warnings = judged or target_kind(
        configured, loaded.target_kind, loaded.target, found_evidence
    )
    loaded = dataclasses.replace(loaded, target_kind=kind)
    mean, std, constant = builder.statistics()
    stats = (mean, std, target_moments[kind])
    found = found_schema(loaded, cfg, builder.names, stats, np.stack(builder.statics))
    if cfg.group_column:  # forecast through the embedding's unseen row, as one listed later
        found["untrained"] = untrained
    schema = resolve(found, constant)
    arrays = builder.normalize(schema, drop_features(found, schema["dropped"])[1])
    splits = {"cuts": cuts.to_dict(), "instruments": spans, "target_warnings": warnings}
    return schema, arrays, splits
