"""The model's outputs of the windows after a run's test split (#68). The test split ends at each
name's last window with every step realised; the windows after it (the file's last horizon of
origins) move ACI's level before a name's latest origin by their realised steps, so predict and
the consumer replay them. ACI's stored state holds their interval ends beside the pending test
windows' (`bounds`): serving the file the run trained on, they run the model on each name's
latest window alone; on a longer file, on the windows after the file's end."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow.dataset as pads
import torch
from foxhunt_serve import Todo, stored_outputs

from foxhunt.app.predict.predictor import Predictor
from foxhunt.app.predict.windows import build_windows
from foxhunt.data.names import resolve_names
from foxhunt.errors import DataError
from foxhunt.evaluation.calibration import Calibration
from foxhunt.training.module import TFTModule, forecasts_unseen

log = logging.getLogger(__name__)


def hold_after_test(cal: Calibration, module: TFTModule, datamodule: Any, cfg: Any) -> None:
    """Add to `cal`'s ACI state the model's interval ends of each name's windows after its
    test split, in the training file (a name with a state of its own; not on the lazy path,
    whose files are not read whole). Without them the state is whole, and serving slower: a
    failure here is a warning, not the run's end."""
    try:
        _hold(cal, module, datamodule, cfg)
    except Exception as exc:  # noqa: BLE001 - a speed-up of serving; the run stands without it
        log.warning("calibration: the windows after the test split are not held: %r", exc)


def _hold(cal: Calibration, module: TFTModule, datamodule: Any, cfg: Any) -> None:
    todo = Todo.of(cal.to_dict(), False)
    if todo.replay is None or datamodule.store_path is not None:
        return
    data_cfg = datamodule.cfg.copy()
    table = pads.dataset(str(data_cfg.path)).to_table()
    resolve_names(data_cfg, pads.dataset(table))
    schema, model = datamodule.schema, module.model.eval()
    try:
        unseen = forecasts_unseen(model, schema)
        clock = datamodule.section.clock  # the run's
        windows = build_windows(table, data_cfg, schema, False, unseen, todo.replay, clock)
    except DataError as exc:  # known inputs of the user's without the rows after the data
        log.info("calibration: no windows after the test split held (%s)", str(exc)[:80])
        return
    shape = (len(windows.origin_ns), schema.prediction_length, len(cal.quantiles))
    held = stored_outputs(cal.to_dict(), windows.instrument, windows.origin_ns, shape)
    device = next(model.parameters()).device
    predictor = Predictor(model, schema, data_cfg, device, dict(cfg.model), {"name": "fp32"})
    with torch.inference_mode():
        pred = predictor._forward(windows.dataset, False, held)
    lo, hi = [i for i, _ in cal.pairs], [j for _, j in cal.pairs]
    added = 0
    for i in np.flatnonzero(~held[0]):
        own = cal.state.get(str(windows.instrument[i]))
        if own is not None:
            ends = [pred[i][:, lo].tolist(), pred[i][:, hi].tolist()]
            own.setdefault("bounds", {})[str(int(windows.origin_ns[i]))] = ends
            added += 1
    log.info("calibration: ACI's state holds the outputs of %d windows after the test", added)
