"""DPR (Karpukhin et al. 2020): a retriever's two towers, each a BertModel without a pooler inside transformers'
DPRQuestionEncoder (`question_encoder.bert_model.*`) or DPRContextEncoder (`ctx_encoder.bert_model.*`); a tower's
vector (`pooler_output`) is the last layer's [CLS] vector, mapped by a linear layer to `projection_dim` when that is
above 0 (`encode_proj`). Both classes read as one family: the question layout is written, the context layout read
(and written when a writer asks for it: `bertforge retriever export-dpr`). A model read from either trains and saves
as BERT (`wraps`): a sentence-transformers folder holds a BertModel, not a DPR class."""
from typing import Any

from bertforge.families.family import (PROJECTION, CheckpointLayout, ConfigSchema, Defaults, Family, Heads,
                                       bert_read_config, bert_write_config)
from bertforge.families.record.schema import BERT_CHECKS, MAX_WIDTH, Field, checks

QUESTION, CONTEXT = "question_encoder", "ctx_encoder"


def write_config(cfg: Any) -> dict[str, Any]:
    return {**bert_write_config(cfg), "projection_dim": 0}  # `extra` holds a tower's own projection_dim


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    return {**bert_read_config(fam, d, source, ours), "causal": False}


def _rules(tower: str) -> tuple[tuple[str, str], ...]:
    return ((r"^bert\.", f"{tower}.bert_model."), (rf"^{PROJECTION}\.", f"{tower}.encode_proj."))


FAMILY = Family(
    "dpr", "DPR",
    "",  # no bare layout: a tower's own tensors carry the prefix (a bare encoder saves as DPRQuestionEncoder)
    checkpoint=CheckpointLayout(
        weight_rules=_rules(QUESTION),
        alternative_weight_rules=_rules(CONTEXT),
        wraps="bert",
        architecture="DPRQuestionEncoder",
        alternative_architecture="DPRContextEncoder",
        sentence_pooling="cls",
        projection_field="projection_dim"),
    schema=ConfigSchema(
        checks=checks((("projection_dim",), Field("int", 0, MAX_WIDTH)), base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config,
        kept_fields=("projection_dim",)),
    defaults=Defaults(
        use_pooler=False),
    heads=Heads(
        hf_task_heads=()))
