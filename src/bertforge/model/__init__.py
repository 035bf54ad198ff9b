"""The model core: one encoder (`encoder.py`), the one attention computation (`attention.py`), and XLNet's
two-stream relative encoder (`xlnet.py`), which computes its attention through the same `attend`.

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
from bertforge.model.xlnet import (
    XLNetEncoder,
    XLNetOutput,
    permutation_mask,
    target_mapping_of,
)

__all__ = ["ATTN_IMPLEMENTATIONS", "PRECISIONS", "AddNorm", "Attention", "Embeddings", "Encoder", "EncoderOutput",
           "FusedSelfAttention", "Intermediate", "Layer", "LayerStack", "MultiHeadAttention", "Pooler",
           "SelfAttention", "XLNetEncoder", "XLNetOutput", "activation", "attend", "for_inference", "permutation_mask",
           "segment_mask", "target_mapping_of"]
