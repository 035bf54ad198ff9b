"""The one table of shapes, `SIZES` (BERT's sizes and the compact ones), with the pretraining defaults that suit
each. A config is a size x a family (`bertforge.families`): `config.compose("albert", "base")`; the encoder-decoders
read the same table (`config.seq2seq.compose_seq2seq`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bertforge.families import DEFAULT_FAMILY, FAMILIES, Family


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

    def settings(self, family: Family = FAMILIES[DEFAULT_FAMILY]) -> dict[str, Any]:
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
