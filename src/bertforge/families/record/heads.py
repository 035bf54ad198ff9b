"""A family's heads (`Family.heads`): the MLM head's activation, how a sequence classifier reads the encoder, which
task heads transformers shares, and replaced-token detection's generator."""
from __future__ import annotations

from dataclasses import dataclass

# The fine-tuning heads (`bertforge.tasks.models`), and how a sequence classifier reads the encoder
# (`Heads.sequence_head`): BERT's pooler + a linear layer, RoBERTa's classification head on the first token, or a
# pooler the head owns (pretrained or not, stored beside the encoder as `pooler.`: DeBERTa's ContextPooler).
TASK_HEADS = ("classify", "regress", "tag", "qa", "choice")
POOLER, FIRST_TOKEN, OWN_POOLER = "pooler", "first-token", "own-pooler"
SEQUENCE_HEADS = (POOLER, FIRST_TOKEN, OWN_POOLER)
# Replaced-token detection's generator (`Heads.rtd_generator`): a quarter of the discriminator's width with the same
# embedding size (ELECTRA's; needs factorised embeddings), or the same width and half the layers (DeBERTa-v3's).
NARROW_GENERATOR, SHALLOW_GENERATOR = "narrow", "shallow"


@dataclass(frozen=True)
class Heads:
    mlm_head_act: str | None = None      # the MLM transform's activation (None: hidden_act; RoBERTa's is erf GELU)
    masked_lm_pooler: bool = False       # its *ForMaskedLM checkpoints carry the pooler (BigBird)
    # how a sequence classifier (and a multiple-choice head) reads the encoder: POOLER, FIRST_TOKEN or OWN_POOLER
    sequence_head: str = POOLER
    pooler_act: str = "tanh"             # the pooler's activation (DeBERTa's ContextPooler: GELU)
    hf_task_heads: tuple[str, ...] = TASK_HEADS  # task heads whose transformers class has bertforge's layout
    single_segment: bool = False         # a pair is one segment: type id 0 throughout, the separator between them
    # replaced-token detection: "rtd" in `Family.head_classes` trains it in the family's own layout (else in
    # `families.RTD_HOST`'s); `rtd_generator` is the generator's shape
    rtd_generator: str = NARROW_GENERATOR
