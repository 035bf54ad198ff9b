"""The model core: one encoder (`encoder.py`), one decoder (`decoder.py`, GPT-2 layout, with its KV cache in
`cache.py`) and the one attention computation (`attention.py`).

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
from bertforge.model.cache import KVCache
from bertforge.model.decoder import Decoder, DecoderLM
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

__all__ = ["ATTN_IMPLEMENTATIONS", "PRECISIONS", "AddNorm", "Attention", "Decoder", "DecoderLM", "Embeddings",
           "Encoder", "EncoderOutput", "KVCache",
           "FusedSelfAttention", "Intermediate", "Layer", "LayerStack", "MultiHeadAttention", "Pooler",
           "SelfAttention", "activation", "attend", "for_inference", "segment_mask"]
