"""The tables every config is composed from: `FAMILIES` (what each member of the family fixes: its Hugging Face names
and its settings) and `SIZES` (shapes, with the pretraining defaults that suit them). `bertforge.config` composes a
`ModelConfig` from one of each; this module imports nothing of bertforge, so every layer may read the tables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish")


@dataclass(frozen=True)
class Family:
    """What one member of the BERT family fixes: its Hugging Face names and its ModelConfig settings."""

    model_type: str
    hf_prefix: str       # HF class names: f"{hf_prefix}Model", f"{hf_prefix}ForMaskedLM", ...
    weight_prefix: str   # the encoder's name inside HF checkpoints with a head: "bert.", "roberta.", ...
    # ModelConfig settings (the defaults are BERT's, as in Hugging Face's BertConfig)
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
    # structure
    factorised: bool = False             # may have embedding_size != hidden_size (a projection E -> H)
    positions_after_padding: bool = False  # position ids start at pad_token_id + 1 (RoBERTa)
    relative_positions: bool = False       # no position table and no length limit (XLNet)
    decoder: bool = False                # a left-to-right decoder (model.decoder), not an encoder
    # the modern switches (BERT's values; see the module docstring)
    norm_position: str = "post"
    position_embedding_type: str = "absolute"
    gated_mlp: bool = False
    bias: bool = True                    # attention, MLP, norm and MLM-transform biases
    local_attention: int | None = None
    global_attn_every_n_layers: int = 1
    rope_theta: float = 10000.0          # global layers
    local_rope_theta: float = 10000.0    # sliding-window layers
    initializer_cutoff_factor: float | None = None  # truncated-normal init at +-factor std
    # Sparse long attention (`bertforge.model.long_attention`): "longformer" (sliding window + global tokens) or
    # "big_bird" (block-sparse window + global + random blocks); None: full attention.
    sparse: str | None = None
    # A gated MLP has two input matrices: 2/3 of the size's intermediate width keeps the parameter count and the
    # FLOPs of the ungated MLP (Shazeer 2020), so a size means the same compute in every family.
    intermediate_scale: float = 1.0

    @property
    def base_architecture(self) -> str:
        """The `architectures` entry of a bare encoder's config.json, e.g. "BertModel"."""
        return f"{self.hf_prefix}Model"

    def settings(self) -> dict[str, Any]:
        """The ModelConfig keyword arguments this family fixes (a size supplies the shape)."""
        return dict(model_type=self.model_type, vocab_size=self.vocab_size, type_vocab_size=self.type_vocab_size,
                    pad_token_id=self.pad_token_id, max_position_embeddings=self.max_position_embeddings,
                    layer_norm_eps=self.layer_norm_eps, hidden_act=self.hidden_act,
                    hidden_dropout_prob=self.dropout, attention_probs_dropout_prob=self.dropout,
                    embedding_size=self.embedding_size, share_layers=self.share_layers, use_pooler=self.use_pooler,
                    norm_position=self.norm_position, position_embedding_type=self.position_embedding_type,
                    gated_mlp=self.gated_mlp, attention_bias=self.bias, mlp_bias=self.bias, norm_bias=self.bias,
                    head_bias=self.bias, local_attention=self.local_attention,
                    global_attn_every_n_layers=self.global_attn_every_n_layers, rope_theta=self.rope_theta,
                    local_rope_theta=self.local_rope_theta, initializer_cutoff_factor=self.initializer_cutoff_factor)

    def intermediate(self, size_intermediate: int) -> int:
        """The MLP width this family uses for a size (gated MLPs: scaled, rounded to a multiple of 64)."""
        if self.intermediate_scale == 1.0:
            return size_intermediate
        return max(64, int(round(size_intermediate * self.intermediate_scale / 64)) * 64)


FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "Bert", "bert"),
    # Liu et al. 2019: byte-level BPE of 50k, <pad> = 1, positions from 2 (514 = 512 + pad + 1), one segment.
    "roberta": Family("roberta", "Roberta", "roberta", vocab_size=50265, pad_token_id=1, max_position_embeddings=514,
                      type_vocab_size=1, layer_norm_eps=1e-5, positions_after_padding=True),
    # Lan et al. 2020: E=128 factorised embeddings, all layers shared, no dropout, gelu_new, a 30k SentencePiece.
    "albert": Family("albert", "Albert", "albert", vocab_size=30000, hidden_act="gelu_new", dropout=0.0,
                     embedding_size=128, share_layers="all", factorised=True),
    # Sanh et al. 2019: no token types, no pooler.
    "distilbert": Family("distilbert", "DistilBert", "distilbert", type_vocab_size=0, use_pooler=False),
    # Clark et al. 2020: no pooler; E may be smaller than H (ELECTRA-Small).
    "electra": Family("electra", "Electra", "electra", use_pooler=False, factorised=True),
    # Yang et al. 2019: Transformer-XL relative attention, two streams, relative segments; a 32k SentencePiece with
    # <pad> = 5; no pooler (XLNet summarises the last token in its task heads).
    "xlnet": Family("xlnet", "XLNet", "transformer", vocab_size=32000, pad_token_id=5, use_pooler=False,
                    relative_positions=True),
    # Radford et al. 2019: a pre-LN decoder, learned positions (1024), tied output embedding, gelu_new, a byte-level
    # BPE of 50257 whose one special token <|endoftext|> is bos, eos and document separator.
    "gpt2": Family("gpt2", "GPT2", "transformer", vocab_size=50257, type_vocab_size=0, pad_token_id=50256,
                   max_position_embeddings=1024, layer_norm_eps=1e-5, hidden_act="gelu_new", use_pooler=False,
                   decoder=True),
    # Warner et al. 2024 (ModernBERT; HF's ModernBertConfig defaults): pre-norm, RoPE (theta 160k global, 10k
    # local), GeGLU, no biases but the decoder's, a 128-token window with global attention every 3rd layer, no
    # dropout, no token types, no pooler, LN eps 1e-5, truncated-normal init at 2 std, a 50,368-token BPE.
    "modernbert": Family("modernbert", "ModernBert", "model", vocab_size=50368, pad_token_id=50283,
                         type_vocab_size=0, max_position_embeddings=8192, layer_norm_eps=1e-5, dropout=0.0,
                         use_pooler=False, norm_position="pre", position_embedding_type="rotary", gated_mlp=True,
                         bias=False, local_attention=128, global_attn_every_n_layers=3, rope_theta=160000.0,
                         initializer_cutoff_factor=2.0, intermediate_scale=2 / 3),
    # Beltagy et al. 2020 (allenai/longformer-base-4096): RoBERTa's body and vocabulary, 4,096 positions (+2: pad
    # and the offset), a 512-token window per layer, global attention on chosen tokens with their own Q/K/V.
    "longformer": Family("longformer", "Longformer", "longformer", vocab_size=50265, pad_token_id=1,
                         max_position_embeddings=4098, type_vocab_size=1, layer_norm_eps=1e-5,
                         positions_after_padding=True, sparse="longformer"),
    # Zaheer et al. 2020 (google/bigbird-roberta-base): BERT's layout, gelu_new, 4,096 positions, block-sparse
    # attention (blocks of 64: 3-block window, first and last block global, 3 random blocks).
    "big_bird": Family("big_bird", "BigBird", "bert", vocab_size=50358, max_position_embeddings=4096,
                       hidden_act="gelu_new", sparse="big_bird"),
}
MODEL_TYPES = tuple(FAMILIES)


@dataclass(frozen=True)
class Size:
    """A shape (BERT paper; Turc et al. 2019 "Well-Read Students Learn Better" for the compact ones) and the
    pretraining defaults that suit it."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    # Peak pretraining learning rate and warm-up share for the default batch (32): larger models diverge or
    # collapse to predicting the most frequent token at rates that small ones need. base/large: BERT's 1e-4
    # (Devlin et al. 2019, batch 256); RoBERTa's 6e-4 / 4e-4 needed batches of 8k (Liu et al. 2019, Table 9);
    # small: ELECTRA-Small's 5e-4 (Clark et al. 2020, Table 6); medium in between; tiny/mini: 1e-3, measured on
    # the stdlib-docs demo. Deeper post-LN stacks get a longer warm-up (Xiong et al. 2020). --lr always wins.
    pretrain_lr: float
    pretrain_warmup: float

    def settings(self, family: Family = FAMILIES["bert"]) -> dict[str, Any]:
        return dict(num_hidden_layers=self.layers, hidden_size=self.hidden, num_attention_heads=self.heads,
                    intermediate_size=family.intermediate(self.intermediate))


SIZES: dict[str, Size] = {
    "tiny": Size(2, 128, 2, 512, pretrain_lr=1e-3, pretrain_warmup=0.06),
    "mini": Size(4, 256, 4, 1024, pretrain_lr=1e-3, pretrain_warmup=0.06),
    "small": Size(4, 512, 8, 2048, pretrain_lr=5e-4, pretrain_warmup=0.06),
    "medium": Size(8, 512, 8, 2048, pretrain_lr=3e-4, pretrain_warmup=0.06),
    "base": Size(12, 768, 12, 3072, pretrain_lr=1e-4, pretrain_warmup=0.1),
    "large": Size(24, 1024, 16, 4096, pretrain_lr=1e-4, pretrain_warmup=0.15),
    # nanoGPT's "baby GPT" shape (6 layers of 6 heads x 64; also MiniLM-L6-H384's depth and width); lr between
    # mini's and small's.
    "l6-h384": Size(6, 384, 6, 1536, pretrain_lr=7e-4, pretrain_warmup=0.06),
}
