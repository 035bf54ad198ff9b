"""The model core: one encoder (`encoder.py`), one decoder (`decoder.py`, GPT-2 layout, with its KV cache in
`cache.py`), XLNet's two-stream relative encoder (`xlnet.py`), and the one attention computation (`attention.py`),
through which all three compute their attention.

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
    layer_norm,
)
from bertforge.model.xlnet import (
    XLNetEncoder,
    XLNetOutput,
    permutation_mask,
    target_mapping_of,
)

__all__ = ["ATTN_IMPLEMENTATIONS", "PRECISIONS", "AddNorm", "Attention", "Decoder", "DecoderLM", "Embeddings",
           "Encoder", "EncoderOutput", "KVCache",
           "FusedSelfAttention", "Intermediate", "Layer", "LayerStack", "MultiHeadAttention", "Pooler",
           "SelfAttention", "XLNetEncoder", "XLNetOutput", "activation", "apply_rotary", "attend", "for_inference",
           "layer_norm", "permutation_mask", "rotary_cos_sin", "segment_mask", "sliding_window_mask",
           "target_mapping_of"]
