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
from bertforge.model.cache import KVCache, Seq2SeqCache
from bertforge.model.decoder import Decoder, DecoderLM
from bertforge.model.seq2seq.model import Seq2SeqLM
from bertforge.model.encoder import (
    PRECISIONS,
    AddNorm,
    EncoderAttention,
    EncoderFeedForward,
    EncoderLayer,
    Embeddings,
    Encoder,
    EncoderOutput,
    LayerStack,
    Pooler,
    activation,
    for_inference,
    is_quantised,
    layer_norm,
    load_weights,
)
from bertforge.model.folder import ModelFolder, open_model_folder, resolve_model_path
from bertforge.model.xlnet import (
    XLNetEncoder,
    XLNetOutput,
    permutation_mask,
    target_mapping_of,
)
from bertforge.model.int8 import INT8_SCHEME, INT8_WEIGHTS, QUANT_FIELD, Int8Linear, load_int8, save_int8
from bertforge.model.sparse.bigbird import BigBirdSelfAttention
from bertforge.model.sparse.longformer import LongformerSelfAttention
from bertforge.model.sparse.layout import SparseLayout, global_mask_from_indices, task_global_mask

__all__ = ["ATTN_IMPLEMENTATIONS", "INT8_SCHEME", "INT8_WEIGHTS", "Int8Linear", "PRECISIONS", "QUANT_FIELD", "AddNorm", "Decoder",
           "DecoderLM", "Embeddings", "Encoder", "EncoderOutput", "KVCache",
           "EncoderAttention", "EncoderFeedForward", "EncoderLayer",
           "FusedSelfAttention", "LayerStack", "MultiHeadAttention", "Pooler",
           "SelfAttention", "Seq2SeqCache", "Seq2SeqLM", "XLNetEncoder", "XLNetOutput", "activation", "apply_rotary", "attend", "for_inference",
           "is_quantised", "layer_norm", "load_int8", "load_weights", "ModelFolder", "open_model_folder",
           "resolve_model_path", "permutation_mask", "rotary_cos_sin", "save_int8",
           "segment_mask", "sliding_window_mask", "target_mapping_of"]
# Sparse long attention (Longformer, BigBird): docs/long.md
__all__ += ["BigBirdSelfAttention", "LongformerSelfAttention", "SparseLayout", "global_mask_from_indices",
            "task_global_mask"]

# Earlier names of the encoder's blocks, still importable from here.
_RENAMED = {"Attention": "EncoderAttention", "Intermediate": "EncoderFeedForward", "Layer": "EncoderLayer"}


def __getattr__(name: str):
    if name in _RENAMED:
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module 'bertforge.model' has no attribute {name!r}")
