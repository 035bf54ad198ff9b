"""BigBird (Zaheer et al. 2020; google/bigbird-roberta-base): BERT's layout, gelu_new, 4,096 positions, block-sparse
attention (blocks of 64: a 3-block window, the first and last block global, 3 random blocks). Tensor names: BERT's,
but the pooler is a bare Linear (BigBirdModel.pooler + a separate tanh), which its masked LM keeps."""
from typing import Any

from bertforge.families.family import (BLOCK_SPARSE, CheckpointLayout, ConfigSchema, Defaults, Family, Heads,
                                       StackTraits, bert_read_config, bert_write_config, refuse_unsupported)
from bertforge.families.record.schema import BERT_CHECKS, MAX_HEADS, TEXT, Field, checks

BLOCK, RANDOM_BLOCKS = 64, 3  # google/bigbird-roberta-base


def write_config(cfg: Any) -> dict[str, Any]:
    return {**bert_write_config(cfg), "attention_type": cfg.attention_type, "block_size": cfg.block_size,
            "num_random_blocks": cfg.num_random_blocks, "use_bias": True, "rescale_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2, "sep_token_id": 66}


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    """The BigBird variants bertforge does not compute are refused by name."""
    refuse_unsupported(source, "BigBird", d, {"use_bias": True, "rescale_embeddings": False, "is_decoder": False})
    return {**bert_read_config(fam, d, source, ours), "attention_type": d.get("attention_type", "block_sparse"),
            "block_size": d.get("block_size", BLOCK), "num_random_blocks": d.get("num_random_blocks", RANDOM_BLOCKS)}


FAMILY = Family(
    "big_bird", "BigBird", "bert",
    head_classes={"mlm": "BigBirdForMaskedLM"},
    checkpoint=CheckpointLayout(
        weight_rules=((r"^bert\.pooler\.dense\.", "bert.pooler."),)),
    schema=ConfigSchema(
        checks=checks((("block_size",), Field("int", 1, MAX_HEADS)), (("num_random_blocks",), Field("int", 0, 64)),
                       (("attention_type",), TEXT), base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config,
        keeps_token_ids=True),
    defaults=Defaults(
        vocab_size=50358,
        max_position_embeddings=4096,
        hidden_act="gelu_new"),
    structure=StackTraits(
        sparse_attention=BLOCK_SPARSE),
    heads=Heads(
        masked_lm_pooler=True,
        # its classification head is dense-act(gelu_new)-out_proj, not bertforge's pooler + linear
        hf_task_heads=("tag", "qa")))
