"""The model core: one encoder (`encoder.py`) and the one attention computation (`attention.py`).

Import from here (`from bertforge.model import Encoder`); modules inside this package import from their siblings.
"""
from bertforge.model.attention import (
    ATTN_IMPLEMENTATIONS,
    FusedSelfAttention,
    MultiHeadAttention,
    SelfAttention,
    apply_rotary,
    attend,
    rotary_cos_sin,
    segment_mask,
    sliding_window_mask,
)
from bertforge.model.encoder import (
    PRECISIONS,
    AddNorm,
    Attention,
    Embeddings,
    Encoder,
    EncoderOutput,
    Intermediate,
    Layer,
    LayerStack,
    Pooler,
    activation,
    for_inference,
    layer_norm,
)

__all__ = ["ATTN_IMPLEMENTATIONS", "PRECISIONS", "AddNorm", "Attention", "Embeddings", "Encoder", "EncoderOutput",
           "FusedSelfAttention", "Intermediate", "Layer", "LayerStack", "MultiHeadAttention", "Pooler",
           "SelfAttention", "activation", "apply_rotary", "attend", "for_inference", "layer_norm", "rotary_cos_sin",
           "segment_mask", "sliding_window_mask"]
