"""The data schema: what a model was trained on (columns by role, instruments, window lengths,
normalization), stored in every checkpoint and checked against the data it is given."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from foxhunt_serve import SCALE_INPUT, instrument_scales, lookup, pooled_scale, scale_input

from foxhunt.data.columns import ColumnPlan, column_plan
from foxhunt.data.names import resolve_data
from foxhunt.data.read import Loaded, instrument_names
from foxhunt.data.source import open_dataset
from foxhunt.data.splits import mean_std
from foxhunt.errors import CheckpointError


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
    static_mean: list[float] = field(default_factory=list)  # per static input
    static_std: list[float] = field(default_factory=list)
    # each instrument's target centre and scale (data.target_scale=instrument;
    # foxhunt_serve.scaling), in the order of `groups`; empty: the pooled target_center and
    # target_scale for all (global, and the models saved before #45)
    target_centres: list[float] = field(default_factory=list)
    target_scales: list[float] = field(default_factory=list)
    # a level target forecast as its move from the last value (false: saved before #45, when
    # the level was z-scored)
    target_anchor: bool = False
    # the columns data.features=all left out, with their type (the run report lists them)
    skipped: dict[str, str] = field(default_factory=dict)
    # features the data gives that the model does not see, with why (constant over the
    # training split); data given to the model later is read without them too
    dropped: dict[str, str] = field(default_factory=dict)
    # each instrument's sessions learned from its bars (`foxhunt_serve.clock.Sessions`): the
    # steps after a short input's bars follow them; empty: saved before they were carried
    sessions: dict[str, Any] = field(default_factory=dict)
    # data.target_transform as applied (foxhunt.data.panel_inputs; auto resolved): predict and
    # the consumer apply it too; "none" for the models saved before it
    target_transform: str = "none"
    # the names in `groups` without a training window: a model with the unseen name's row
    # forecasts them with it, as a name listed after training (foxhunt.data.splits'
    # embedding_rows); empty for the models saved before it
    untrained: list[str] = field(default_factory=list)

    @property
    def encoder_columns(self) -> list[str]:
        return [self.target, *self.observed, *self.known]

    @property
    def num_features(self) -> int:
        """Input features taken from the data, the target's own history not counted."""
        return len(self.observed) + len(self.known) + len(self.static)

    @property
    def static_inputs(self) -> list[str]:
        """The model's static real inputs: the data's, then each instrument's target scale."""
        return [*self.static, SCALE_INPUT] if self.target_scales else list(self.static)

    @property
    def target_center(self) -> float:
        """The pooled centre of the target (an unseen instrument's, every one's for global)."""
        return self.input_mean[0]

    @property
    def target_scale(self) -> float:
        """The pooled scale of the target (an unseen instrument's, every one's for global)."""
        return self.input_std[0]

    def target_of(self, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The target's centre and scale for each instrument index in `group` (float64 arrays
        like it; an index past the vocabulary: an instrument the model has not seen)."""
        return lookup(
            self.target_centres, self.target_scales, self.target_center, self.target_scale, group
        )

    def target_summary(self) -> dict[str, Any]:
        """What summary.json says of the target: its kind, how it is scaled (each instrument's
        own scale, or one pooled), the pooled scale and each instrument's."""
        return {
            "name": self.target,
            "kind": self.target_kind,
            "scale": "instrument" if self.target_scales else "global",
            "anchored": self.target_anchor,  # a level forecast as its move from the last value
            "transform": self.target_transform,  # data.target_transform as applied
            "pooled_scale": self.target_scale,
            "by_instrument": dict(zip(self.groups, self.target_scales, strict=False)),
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataSchema:
        return cls(**d)

    @classmethod
    def from_loaded(
        cls, loaded: Loaded | ColumnPlan, cfg: Any, groups: list[str], **fields: Any
    ) -> DataSchema:
        """The schema of what the data gives: the columns by role of `loaded` (or of the
        column plan it is read by), instruments `groups`, the window lengths of data config
        `cfg`; `fields`: any others (the normalization), or lengths of their own."""
        return cls(
            **{
                "observed": list(loaded.observed),
                "known": list(loaded.known),
                "static": list(loaded.static),
                "groups": list(groups),
                "target": loaded.target,
                "target_kind": loaded.target_kind,
                "encoder_length": cfg.encoder_length,
                "prediction_length": cfg.prediction_length,
                "skipped": dict(loaded.skipped),
                "target_transform": getattr(loaded, "target_transform", "none"),
                **fields,
            }
        )

    def check_matches(self, other: DataSchema, unseen: bool = False) -> None:
        """Raise CheckpointError naming how `other` (the data) differs from this schema
        (`unseen`: the model forecasts names outside its vocabulary, foxhunt.training.module's
        `forecasts_unseen`)."""
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
            "target_transform",
            "encoder_length",
            "prediction_length",
        ):
            if getattr(self, key) != getattr(other, key):
                raise CheckpointError(
                    f"checkpoint and data differ in {key}: "
                    f"{getattr(self, key)!r} (checkpoint) vs {getattr(other, key)!r} (data)"
                )
        new = [g for g in other.groups if g not in self.groups]
        if new and not unseen:
            raise CheckpointError(f"instruments unknown to the checkpoint: {', '.join(new)}")


CONSTANT = "constant over the training split"


def found_schema(
    loaded: Any,
    cfg: Any,
    names: list[str],
    stats: tuple[np.ndarray, np.ndarray, list],
    statics: np.ndarray,
) -> dict[str, Any]:
    """The schema dict of every column the data gives (`loaded`'s, by role; instruments
    `names`), with the training split's input mean and std and each instrument's target
    `moments` (`stats`; a return target's mean set to 0: zero stays zero after scaling; a
    level's scale that of its moves), each instrument's target scale (data.target_scale), and
    the statistics of the instruments' `statics` (with the target scale's input)."""
    mean, std, moments = (np.array(stats[0], np.float64), np.array(stats[1], np.float64), stats[2])
    kind = loaded.target_kind
    if kind == "return":
        mean[0] = 0.0
    else:  # anchored: the level's moves (foxhunt_serve.scaling)
        std[0] = pooled_scale(moments, kind)
    centres, scales = [], []
    if scales_by_instrument(cfg):
        centres, scales = instrument_scales(moments, kind, mean[0], std[0])
        statics = np.column_stack([statics, scale_input(scales, std[0])])
    static_mean, static_std = mean_std(statics)
    return DataSchema.from_loaded(
        loaded,
        cfg,
        names if cfg.group_column else [],
        input_mean=mean.tolist(),
        input_std=std.tolist(),
        static_mean=static_mean.tolist(),
        static_std=static_std.tolist(),
        target_centres=centres,
        target_scales=scales,
        target_anchor=kind == "level",
    ).to_dict()


def constant_features(found: dict[str, Any], constant: Any) -> dict[str, str]:
    """The observed and known features of schema dict `found` flagged in `constant` (one flag
    per encoder column, the target first): a variable selection network still weighs them."""
    names = [*found["observed"], *found["known"]]
    return {n: CONSTANT for n, c in zip(names, list(constant)[1:], strict=True) if c}


def drop_features(found: dict[str, Any], dropped: dict[str, str]) -> tuple[dict, list[int]]:
    """Schema dict `found` (every column the data gives) without the observed and known
    features in `dropped`, and the indices of the encoder columns it keeps."""
    names = [found["target"], *found["observed"], *found["known"]]
    keep = [i for i, c in enumerate(names) if i == 0 or c not in dropped]
    out = dict(found, dropped={c: why for c, why in dropped.items() if c in names[1:]})
    out["observed"] = [c for c in found["observed"] if c not in dropped]
    out["known"] = [c for c in found["known"] if c not in dropped]
    for key in ("input_mean", "input_std"):
        if found.get(key):
            out[key] = [found[key][i] for i in keep]
    return out, keep


def footer_schema(cfg: Any) -> DataSchema:
    """The configured data's schema from its Parquet footers and group column alone, without
    normalization statistics: enough to size a model (the memory estimator's input)."""
    resolve_data(cfg)
    dataset = open_dataset(cfg.path)
    names = instrument_names(dataset, cfg)
    # each instrument's target scale, an input of the model too (`found_schema`): its size
    # now, its values (placeholders here) from the training split
    scales = [1.0] * len(names) if scales_by_instrument(cfg) else []
    return DataSchema.from_loaded(
        column_plan(dataset, cfg), cfg, names, target_centres=[0.0] * len(scales),
        target_scales=scales,
    )  # fmt: skip


def scales_by_instrument(cfg: Any) -> bool:
    """Whether data config `cfg` scales the target per instrument (data.target_scale)."""
    return bool(cfg.group_column) and str(getattr(cfg, "target_scale", "global")) == "instrument"


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
        "static_real": torch.randn(batch_size, len(schema.static_inputs), device=device),
        "target": torch.randn(batch_size, h, device=device),
        "target_last": torch.randn(batch_size, device=device),
        "target_scale": torch.ones(batch_size, device=device),
    }
