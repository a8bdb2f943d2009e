"""Temporal Fusion Transformer (Lim et al. 2021) as a plain ``torch.nn.Module``.

The architecture and parameterisation mirror pytorch-forecasting's ``TemporalFusionTransformer``
(shared continuous prescalers, ResampleNorm skips, shared post-LSTM gate, ...), except that the
variable selection networks evaluate all per-variable GRNs at once with stacked weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from foxhunt.errors import ConfigError
from foxhunt.models.blocks import (
    GateAddNorm,
    GatedResidualNetwork,
    Highway,
    InterpretableMultiHeadAttention,
    MonotoneQuantiles,
    VariablePrescaler,
    VariableSelectionNetwork,
)

# the constructor arguments a model saved before they existed (its checkpoint, fp32 or int8
# export) lacks, as it was built: foxhunt 0.1 had no highway (#25) and no monotone head (#28);
# until #45 the highway was added before the monotone head, one weight per quantile
UNSAVED_DEFAULTS = {"highway": False, "monotone": False, "highway_first": True}


class TemporalFusionTransformer(nn.Module):
    """Multi-horizon quantile forecaster of Lim et al. (2021), Fig. 2.

    Inputs (``x``):
      * ``encoder_cont`` float [B, E, num_observed + num_known]: observed, then known.
      * ``decoder_known`` float [B, H, num_known] with H == prediction_length.
      * ``static_cat`` long [B, len(static_cardinalities)] (only read if there are any).
      * ``static_real`` float [B, num_static_real] (only read if there are any).

    A relative time index is appended as the last known variable, so the encoder selects among
    ``num_observed + num_known + 1`` variables and the decoder among ``num_known + 1``.

    ``highway`` (not in Lim et al.) adds a linear forecast to every quantile output: of the
    encoder's last row of inputs per horizon step, and of each decoder step's known inputs
    (LSTNet's autoregressive highway, Lai et al. 2018). Every input reaches the TFT's body through
    per-variable LayerNorms and gates, which bound its embedding: a forecast linear in an
    input's size (an AR(1) return, a predictive column) is then slow to learn (docs/model.md
    measures it). Zero at initialisation, so training starts from the plain TFT. With
    ``monotone`` it is one forecast per horizon step added to the monotone head's quantiles (a
    shift, which keeps them in order); without, one per quantile added to the independent heads.

    ``anchor`` (a level target, such as a price) feeds the target's history as its moves from the
    last value and forecasts the move from it, added back to the output: the naive forecast is
    the model's zero, and a price level is never extrapolated from a z-score.

    ``monotone`` (not in Lim et al.) makes the quantile outputs non-decreasing in the level for
    any weights (`MonotoneQuantiles`): the quantiles must then be given in increasing order.

    ``highway_first``: the order of the models saved before #45 (``UNSAVED_DEFAULTS``), which
    load as they were: the highway, one weight per quantile, added to the head's values before
    the monotone head, so that away from the median it passes through a gap's softplus.
    """

    def __init__(
        self,
        *,
        num_observed: int,
        num_known: int,
        prediction_length: int,
        static_cardinalities: Sequence[int] = (),
        num_static_real: int = 0,
        hidden_dim: int,
        num_heads: int,
        lstm_layers: int,
        dropout: float,
        variable_dim: int,
        quantiles: Sequence[float],
        highway: bool,
        monotone: bool,
        highway_first: bool,
        anchor: bool = False,
    ) -> None:
        super().__init__()
        if min(num_observed, num_known, num_static_real) < 0:
            raise ConfigError("variable counts must be non-negative")
        if prediction_length < 1 or hidden_dim < 1 or variable_dim < 1 or lstm_layers < 1:
            raise ConfigError(
                "prediction_length, hidden_dim, variable_dim and lstm_layers must be positive"
            )
        if num_heads < 1 or hidden_dim % num_heads != 0:
            raise ConfigError(f"hidden_dim ({hidden_dim}) must be a multiple of num_heads")
        if not quantiles:
            raise ConfigError("at least one quantile is required")
        if any(c < 1 for c in static_cardinalities):
            raise ConfigError("static cardinalities must be positive")

        self.num_observed = num_observed
        self.num_known = num_known
        self.prediction_length = prediction_length
        self.hidden_dim = hidden_dim
        self.lstm_layers = lstm_layers
        self.quantiles = tuple(float(q) for q in quantiles)
        if monotone and list(self.quantiles) != sorted(set(self.quantiles)):
            raise ConfigError(f"monotone quantiles must be increasing, got {self.quantiles}")
        self._gradient_checkpointing = False
        self.num_encoder_vars = num_observed + num_known + 1
        self.num_decoder_vars = num_known + 1
        self.num_static_cat = len(static_cardinalities)
        self.num_static_real = num_static_real
        self.num_static_vars = self.num_static_cat + num_static_real
        self.anchor = anchor
        # the parts in the order of their parameters (the same seed gives the same weights)
        self._build_inputs(static_cardinalities, variable_dim)
        self._build_variable_selections(variable_dim, dropout)
        self._build_static_encoders(dropout)
        self._build_lstms(dropout)
        self._build_attention(num_heads, dropout)
        self._build_head(highway, monotone, highway_first)

    @property
    def instrument_rows(self) -> int:
        """The rows of the instrument embedding, the first static categorical (0: none)."""
        return self.static_embeddings[0].num_embeddings if self.num_static_cat else 0

    def _build_inputs(self, static_cardinalities: Sequence[int], variable_dim: int) -> None:
        """Input transformations (sec. 4.2). One prescaler per time-varying real, shared by the
        encoder and decoder as in pytorch-forecasting; ordered [observed, known, relative time]
        so the decoder's variables are the trailing slice."""
        self.prescaler = VariablePrescaler(self.num_encoder_vars, variable_dim)
        self.static_prescaler = VariablePrescaler(self.num_static_real, variable_dim)
        self.static_embeddings = nn.ModuleList(
            nn.Embedding(cardinality, variable_dim) for cardinality in static_cardinalities
        )

    def _build_variable_selections(self, variable_dim: int, dropout: float) -> None:
        """Variable selection (sec. 4.2); none for statics when there are none."""
        h = self.hidden_dim
        self.static_variable_selection = (
            VariableSelectionNetwork(self.num_static_vars, variable_dim, h, dropout)
            if self.num_static_vars > 0
            else None
        )
        self.encoder_variable_selection = VariableSelectionNetwork(
            self.num_encoder_vars, variable_dim, h, dropout, context_size=h
        )
        self.decoder_variable_selection = VariableSelectionNetwork(
            self.num_decoder_vars, variable_dim, h, dropout, context_size=h
        )

    def _build_static_encoders(self, dropout: float) -> None:
        """Static covariate encoders (sec. 4.3): contexts c_s, c_h, c_c and c_e."""
        h = self.hidden_dim
        self.static_context_variable_selection = GatedResidualNetwork(h, h, h, dropout)
        self.static_context_initial_hidden_lstm = GatedResidualNetwork(h, h, h, dropout)
        self.static_context_initial_cell_lstm = GatedResidualNetwork(h, h, h, dropout)
        self.static_context_enrichment = GatedResidualNetwork(h, h, h, dropout)

    def _build_lstms(self, dropout: float) -> None:
        """Locality enhancement with a sequence-to-sequence layer (sec. 4.5.1)."""
        h, layers = self.hidden_dim, self.lstm_layers
        lstm_dropout = dropout if layers > 1 else 0.0
        self.lstm_encoder = nn.LSTM(h, h, layers, batch_first=True, dropout=lstm_dropout)
        self.lstm_decoder = nn.LSTM(h, h, layers, batch_first=True, dropout=lstm_dropout)
        # pytorch-forecasting shares this gate between encoder and decoder positions.
        self.post_lstm_gate_norm = GateAddNorm(h, h, dropout)

    def _build_attention(self, num_heads: int, dropout: float) -> None:
        """Static enrichment (sec. 4.5.2), temporal self-attention (4.5.3), feed-forward (4.5.4)."""
        h = self.hidden_dim
        self.static_enrichment = GatedResidualNetwork(h, h, h, dropout, context_size=h)
        self.multihead_attn = InterpretableMultiHeadAttention(h, num_heads, dropout)
        self.post_attn_gate_norm = GateAddNorm(h, h, dropout)
        self.pos_wise_ff = GatedResidualNetwork(h, h, h, dropout)
        # No dropout this close to the output, as in pytorch-forecasting.
        self.pre_output_gate_norm = GateAddNorm(h, h, None)

    def _build_head(self, highway: bool, monotone: bool, highway_first: bool) -> None:
        """Quantile outputs (sec. 4.6), with the highway and the monotone head if asked for."""
        n_quantiles = len(self.quantiles)
        self.output_layer = nn.Linear(self.hidden_dim, n_quantiles)
        n_inputs = self.num_observed + self.num_known
        # after the monotone head, one forecast shifts every quantile alike
        self.highway_after = monotone and not highway_first
        self.highway = (
            Highway(
                n_inputs,
                self.num_known,
                self.prediction_length,
                1 if self.highway_after else n_quantiles,
            )
            if highway
            else None
        )
        median = min(range(n_quantiles), key=lambda i: abs(self.quantiles[i] - 0.5))
        # quantiles in order by construction (monotone=False: independent heads, as in Lim et
        # al., the models trained before it)
        self.monotone = MonotoneQuantiles(n_quantiles, median) if monotone else None

    @property
    def gradient_checkpointing(self) -> bool:
        """Recompute in backward instead of keeping activations (memory.gradient_checkpointing):
        the variable selection networks their per-variable GRNs, the LSTMs and the attention
        block everything; training only."""
        return self._gradient_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, on: bool) -> None:
        self._gradient_checkpointing = on
        for vsn in (self.encoder_variable_selection, self.decoder_variable_selection):
            vsn.recompute = on

    def num_parameters(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def forward(self, x: Mapping[str, Tensor]) -> Tensor:
        """Quantile predictions [B, prediction_length, len(quantiles)]."""
        prediction, _ = self._run(x, need_weights=False)
        return prediction

    def interpret(self, x: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Predictions plus variable selection weights and head-averaged decoder attention.

        Keys: ``prediction`` [B, H, Q], ``encoder_variable_weights`` [B, E, num_encoder_vars],
        ``decoder_variable_weights`` [B, H, num_decoder_vars], ``static_variable_weights``
        [B, num_static_vars] and ``attention`` [B, H, E + H] (rows sum to one).
        """
        prediction, interpretation = self._run(x, need_weights=True)
        return {"prediction": prediction, **interpretation}

    def _run(self, x: Mapping[str, Tensor], need_weights: bool) -> tuple[Tensor, dict[str, Tensor]]:
        encoder_cont = x["encoder_cont"]
        decoder_known = x["decoder_known"]
        self._check_inputs(encoder_cont, decoder_known)
        last = encoder_cont[:, -1:, :1]  # [B, 1, 1] the target's last value
        if self.anchor:  # a level: its history, and the forecast, as moves from the last value
            encoder_cont = torch.cat([encoder_cont[..., :1] - last, encoder_cont[..., 1:]], -1)
        enc_len, dec_len = encoder_cont.shape[1], decoder_known.shape[1]
        encoder_real, decoder_real = self._with_relative_time(encoder_cont, decoder_known)

        static_embedding, static_weights = self._static_embedding(x, encoder_cont)

        # Static contexts are broadcast over time via a singleton time axis.
        selection_context = self.static_context_variable_selection(static_embedding).unsqueeze(1)
        w, b = self.prescaler.weight, self.prescaler.bias
        encoder_input, encoder_weights = self.encoder_variable_selection.forward_scalars(
            encoder_real, (w, b), selection_context
        )
        decoder_input, decoder_weights = self.decoder_variable_selection.forward_scalars(
            decoder_real, (w[self.num_observed :], b[self.num_observed :]), selection_context
        )

        initial_hidden = self.static_context_initial_hidden_lstm(static_embedding)
        initial_cell = self.static_context_initial_cell_lstm(static_embedding)
        encoder_output, decoder_output = self._checkpointed(
            self._lstm, encoder_input, decoder_input, initial_hidden, initial_cell
        )

        lstm_output = self.post_lstm_gate_norm(
            torch.cat([encoder_output, decoder_output], dim=1),
            torch.cat([encoder_input, decoder_input], dim=1),
        )
        enrichment_context = self.static_context_enrichment(static_embedding).unsqueeze(1)
        enriched = self.static_enrichment(lstm_output, enrichment_context)
        output, attention = self._attend(enriched, lstm_output, enc_len, dec_len, need_weights)
        prediction = self._quantile_outputs(output, encoder_cont, decoder_known)
        if self.anchor:
            prediction = prediction + last

        if not need_weights:
            return prediction, {}
        return prediction, {
            "encoder_variable_weights": encoder_weights,
            "decoder_variable_weights": decoder_weights,
            "static_variable_weights": static_weights,
            "attention": attention,
        }

    @staticmethod
    def _with_relative_time(encoder_cont: Tensor, decoder_known: Tensor) -> tuple[Tensor, Tensor]:
        """The encoder's and the decoder's real inputs with the relative time index appended."""
        batch, enc_len, _ = encoder_cont.shape
        dec_len = decoder_known.shape[1]
        relative_time = torch.arange(
            enc_len + dec_len, device=encoder_cont.device, dtype=encoder_cont.dtype
        )
        relative_time = ((relative_time - enc_len) / max(enc_len, dec_len)).view(1, -1, 1)
        encoder_real = torch.cat(
            [encoder_cont, relative_time[:, :enc_len].expand(batch, -1, -1)], dim=-1
        )
        decoder_real = torch.cat(
            [decoder_known, relative_time[:, enc_len:].expand(batch, -1, -1)], dim=-1
        )
        return encoder_real, decoder_real

    def _attend(
        self, enriched: Tensor, lstm_output: Tensor, enc_len: int, dec_len: int, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The forecast positions after self-attention over the enriched window (sec. 4.5.3),
        the feed-forward (4.5.4) and the gate back to the LSTM's output; the attention."""
        # Only the forecast positions are queried; they attend to the whole window.
        attended, attention = self._checkpointed(
            self.multihead_attn,
            enriched[:, enc_len:],
            enriched,
            self._causal_mask(enc_len, dec_len, enriched.device),
            need_weights,
        )
        output = self.post_attn_gate_norm(attended, enriched[:, enc_len:])
        output = self.pos_wise_ff(output)
        return self.pre_output_gate_norm(output, lstm_output[:, enc_len:]), attention

    def _quantile_outputs(
        self, output: Tensor, encoder_cont: Tensor, decoder_known: Tensor
    ) -> Tensor:
        """The quantile predictions [B, H, Q] from the decoder's output (sec. 4.6)."""
        prediction = self.output_layer(output)
        highway = None if self.highway is None else self.highway(encoder_cont[:, -1], decoder_known)
        if highway is not None and not self.highway_after:
            prediction = prediction + highway
        if self.monotone is not None:
            prediction = self.monotone(prediction)
        if highway is not None and self.highway_after:
            prediction = prediction + highway  # [B, H, 1]: the same on every quantile
        return prediction

    def _lstm(self, encoder_input: Tensor, decoder_input: Tensor, h0: Tensor, c0: Tensor):  # noqa: ANN202
        if lstm_leaves_autocast(encoder_input):
            with torch.autocast("cpu", enabled=False):
                inputs = (encoder_input, decoder_input, h0, c0)
                return self._lstms(*(t.float() for t in inputs))
        return self._lstms(encoder_input, decoder_input, h0, c0)

    def _lstms(self, encoder_input: Tensor, decoder_input: Tensor, h0: Tensor, c0: Tensor):  # noqa: ANN202
        # cuDNN wants contiguous initial states, and expand() alone gives a stride-0 view.
        state = (
            h0.expand(self.lstm_layers, -1, -1).contiguous(),
            c0.expand(self.lstm_layers, -1, -1).contiguous(),
        )
        encoder_output, state = self.lstm_encoder(encoder_input, state)
        # torch 2.11's torch.export, with a dynamic batch, gives the state as (layers, 1, batch,
        # hidden); a reshape back to 3-D (a view in eager) lets the decoder take it
        state = tuple(s.reshape(self.lstm_layers, -1, s.shape[-1]) for s in state)
        decoder_output, _ = self.lstm_decoder(decoder_input, state)
        return encoder_output, decoder_output

    def _checkpointed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), recomputed in backward instead of keeping its activations when
        `gradient_checkpointing` is on (training only)."""
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def _static_embedding(self, x: Mapping[str, Tensor], like: Tensor) -> tuple[Tensor, Tensor]:
        batch = like.shape[0]
        if self.static_variable_selection is None:
            # Like pytorch-forecasting: without statics the contexts come from a zero embedding.
            return (
                like.new_zeros(batch, self.hidden_dim),
                like.new_zeros(batch, 0),
            )
        parts = []
        if self.num_static_cat > 0:
            static_cat = x["static_cat"]
            parts.extend(
                embedding(static_cat[:, i]) for i, embedding in enumerate(self.static_embeddings)
            )
        if self.num_static_real > 0:
            parts.extend(self.static_prescaler(x["static_real"]).unbind(dim=1))
        return self.static_variable_selection(torch.stack(parts, dim=1))

    @staticmethod
    def _causal_mask(enc_len: int, dec_len: int, device: torch.device) -> Tensor:
        # Decoder step i may attend to every encoder step and to decoder steps 0..i.
        query = torch.arange(dec_len, device=device).unsqueeze(1) + enc_len
        key = torch.arange(enc_len + dec_len, device=device).unsqueeze(0)
        return key <= query

    def _check_inputs(self, encoder_cont: Tensor, decoder_known: Tensor) -> None:
        expected = self.num_observed + self.num_known
        if encoder_cont.ndim != 3 or encoder_cont.shape[-1] != expected:
            raise ValueError(
                f"encoder_cont must be [B, E, {expected}], got {tuple(encoder_cont.shape)}"
            )
        if encoder_cont.shape[1] < 1:
            raise ValueError("encoder_cont needs at least one time step")
        if decoder_known.shape != (
            encoder_cont.shape[0],
            self.prediction_length,
            self.num_known,
        ):
            raise ValueError(
                f"decoder_known must be [B, {self.prediction_length}, {self.num_known}], "
                f"got {tuple(decoder_known.shape)}"
            )


@cache
def _onednn_has_bf16() -> bool:
    # oneDNN's bfloat16 needs AVX-512 (avx512_core) or AVX2-VNNI-2; ONEDNN_MAX_CPU_ISA may lower
    # what it uses
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_lstms_need_float32() -> bool:
    """Whether CPU LSTMs must run in float32 under bfloat16 autocast: it casts oneDNN's LSTM
    to bfloat16, which oneDNN cannot build on a CPU without AVX-512 ("could not create a
    primitive descriptor for the LSTM forward propagation primitive")."""
    return (
        torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and not _onednn_has_bf16()
    )


def lstm_leaves_autocast(x: Tensor) -> bool:
    """Whether the LSTMs on input `x` run in float32 outside the autocast that is on (CPU
    bfloat16 autocast where `cpu_lstms_need_float32`); elsewhere (CUDA, a CPU with bfloat16)
    they run as autocast has them."""
    return (
        x.device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
        and cpu_lstms_need_float32()
    )
