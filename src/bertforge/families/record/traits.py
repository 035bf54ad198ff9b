"""The settings a family fixes (`Family.defaults`: transformers' defaults for the family) and the structure it
builds (`Family.structure`: the switches the shared model code reads)."""
from __future__ import annotations

from dataclasses import dataclass

# Sparse long attention (`StackTraits.sparse_attention`, computed in `bertforge.model.sparse`).
SLIDING_WINDOW = "sliding-window"  # a window per layer plus global tokens of the caller's choice (Longformer)
BLOCK_SPARSE = "block-sparse"      # blocks: a window, the first and last block global, random blocks (BigBird)
# The MLP (`StackTraits.mlp`): plain (two matrices), gated (GeGLU's [W_a; W_g], ModernBERT), or either, chosen per
# model by its config (T5 v1.1's gated-gelu).
PLAIN_MLP, GATED_MLP, EITHER_MLP = "plain", "gated", "either"
MLP_KINDS = (PLAIN_MLP, GATED_MLP, EITHER_MLP)


@dataclass(frozen=True)
class Defaults:
    vocab_size: int = 30522
    type_vocab_size: int = 2
    pad_token_id: int = 0
    max_position_embeddings: int = 512
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    dropout: float = 0.1                 # hidden and attention-probability dropout
    embedding_size: int | None = None    # None: the hidden size (no factorisation)
    share_layers: str = "none"
    use_pooler: bool = True
    local_attention: int | None = None
    global_attn_every_n_layers: int = 1
    rope_theta: float = 10000.0          # global layers
    local_rope_theta: float = 10000.0    # sliding-window layers
    initializer_cutoff_factor: float | None = None  # truncated-normal init at +-factor std
    # A gated MLP has two input matrices: 2/3 of the size's intermediate width keeps the parameter count and the
    # FLOPs of the ungated MLP (Shazeer 2020), so a size means the same compute in every family.
    intermediate_scale: float = 1.0


@dataclass(frozen=True)
class StackTraits:
    factorised: bool = False             # may have embedding_size != hidden_size (a projection E -> H)
    positions_after_padding: bool = False  # position ids start at pad_token_id + 1 (RoBERTa)
    relative_positions: bool = False     # no learned position table: relative positions (XLNet, T5)
    # attention streams: 1, or 2 for XLNet's content + query streams (`model.xlnet.XLNetEncoder`, which trains the
    # permutation LM; not `model.Encoder`)
    streams: int = 1
    causal_encoder: bool = False         # transformers' is_decoder=True on this encoder: a causal mask
    norm_position: str = "post"
    rms_norm: bool = False               # RMSNorm (no mean, no bias) instead of LayerNorm (T5)
    position_embedding_type: str = "absolute"
    mlp: str = PLAIN_MLP                 # PLAIN_MLP, GATED_MLP or EITHER_MLP
    bias: bool = True                    # attention, MLP, norm and MLM-transform biases
    scaled_attention: bool = True        # scores divided by sqrt(head_dim) (T5: not; its init absorbs it)
    sparse_attention: str | None = None  # SLIDING_WINDOW, BLOCK_SPARSE, or None: full attention
