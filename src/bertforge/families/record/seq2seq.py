"""The encoder-decoders' settings, output and generation (`Family.seq2seq`)."""
from __future__ import annotations

from dataclasses import dataclass

# Initialisation of the encoder-decoders (`Seq2SeqTraits.init`): every matrix N(0, initializer_range) (BART), or
# each matrix at 1/sqrt(fan-in) times initializer_factor, Mesh TensorFlow's (T5).
NORMAL_INIT, FAN_IN_INIT = "normal", "fan-in"


@dataclass(frozen=True)
class Seq2SeqTraits:
    bos_token_id: int | None = None      # the id a prompt starts with (None: none)
    eos_token_id: int | None = None      # the id generation stops at
    sublayer_dropout: float | None = None  # attention and activation dropout (None: `Defaults.dropout`)
    position_offset: int = 0             # rows of the position table before position 0 (BART: 2)
    own_head_width: bool = False         # a head width of its own (T5's d_kv), not d_model / heads
    init: str = NORMAL_INIT              # NORMAL_INIT or FAN_IN_INIT
    rescales_output: bool = False        # hidden * d_model**-0.5 before the tied projection (T5)
    final_logits_bias: bool = False      # a bias buffer on the logits (BART)
    embedding_padding_idx: bool = False  # the shared embedding's padding row gets no gradient (BART)
    decoder_starts_with: str = "pad"     # the token the decoder starts from: "pad" (T5) or "eos" (BART)
    prompt_starts_with_bos: bool = False  # a prompt is "<s> text </s>" (BART), else "text </s>"
    forces_eos: bool = False             # generation ends on a forced eos (BART's forced_eos_token_id)
