"""The model core: one encoder (`encoder.py`) and the one attention computation (`attention.py`).

Import from here (`from bertforge.model import Encoder`); modules inside this package import from their siblings.
"""
from bertforge.model.attention import (
    ATTN_IMPLEMENTATIONS,
    FusedSelfAttention,
    MultiHeadAttention,
    SelfAttention,
    attend,
    segment_mask,
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
)

__all__ = ["ATTN_IMPLEMENTATIONS", "PRECISIONS", "AddNorm", "Attention", "Embeddings", "Encoder", "EncoderOutput",
           "FusedSelfAttention", "Intermediate", "Layer", "LayerStack", "MultiHeadAttention", "Pooler",
           "SelfAttention", "activation", "attend", "for_inference", "segment_mask"]
