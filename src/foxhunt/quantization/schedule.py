"""When quantization-aware training observes ranges and fake-quantizes (a function of the
epoch alone, so a resumed run does exactly what an uninterrupted one does)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn

from foxhunt.quantization.qat import set_qat_phase


class QATSchedule(L.Callback):
    """Float training before `qat_start_epoch`; fake quantization from it on; observers update
    ranges until `qat_start_epoch + observer_epochs`, then freeze. Evaluation never observes."""

    def __init__(self, qat_start_epoch: int, observer_epochs: int) -> None:
        self.start = qat_start_epoch
        self.observe_until = qat_start_epoch + observer_epochs

    def _train_phase(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        set_qat_phase(pl_module.model, epoch < self.observe_until, epoch >= self.start)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._train_phase(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        set_qat_phase(pl_module.model, False, trainer.current_epoch >= self.start)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._train_phase(trainer, pl_module)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        set_qat_phase(pl_module.model, False, True)
