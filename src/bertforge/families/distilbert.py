"""DistilBERT (Sanh et al. 2019): BERT-base's width at half its depth, no token types, no pooler; its own
config.json schema (`dim`, `n_layers`, ...) and tensor names (`q_lin`, `ffn.lin1`, `vocab_projector`, ...).
transformers' DistilBERT sequence-classification and multiple-choice heads differ from bertforge's (those are saved
as bertforge's)."""
from typing import Any

from bertforge.families.family import LAYER, CheckpointLayout, ConfigSchema, Defaults, Family, Heads, common_fields
from bertforge.families.record.schema import BERT_CHECKS, FFN, HEADS, LAYERS, RATE, WIDTH, checks

_LAYER_OUT = r"distilbert.transformer.layer.\1."


def write_config(cfg: Any) -> dict[str, Any]:
    return dict(model_type="distilbert", dim=cfg.hidden_size, n_layers=cfg.num_hidden_layers,
                n_heads=cfg.num_attention_heads, hidden_dim=cfg.intermediate_size, activation=cfg.hidden_act,
                dropout=cfg.hidden_dropout_prob, attention_dropout=cfg.attention_probs_dropout_prob,
                sinusoidal_pos_embds=False, tie_weights_=True, **common_fields(cfg))


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    return dict(model_type="distilbert", vocab_size=d["vocab_size"], hidden_size=d["dim"],
                num_hidden_layers=d["n_layers"], num_attention_heads=d["n_heads"],
                intermediate_size=d["hidden_dim"], hidden_act=d.get("activation", "gelu"),
                hidden_dropout_prob=d.get("dropout", 0.1), attention_probs_dropout_prob=d.get("attention_dropout", 0.1),
                max_position_embeddings=d.get("max_position_embeddings", 512), type_vocab_size=fam.type_vocab_size,
                initializer_range=d.get("initializer_range", 0.02), layer_norm_eps=1e-12,
                pad_token_id=d.get("pad_token_id", 0), use_pooler=fam.use_pooler,
                heads_per_layer=ours.get("heads_per_layer"))


FAMILY = Family(
    "distilbert", "DistilBert", "distilbert",
    head_classes={"mlm": "DistilBertForMaskedLM"},
    presets={"distilbert-base": ("base", dict(num_hidden_layers=6))},  # half of BERT-base's layers
    checkpoint=CheckpointLayout(
        weight_rules=(
            (LAYER + r"attention\.self\.query\.", _LAYER_OUT + "attention.q_lin."),
            (LAYER + r"attention\.self\.key\.", _LAYER_OUT + "attention.k_lin."),
            (LAYER + r"attention\.self\.value\.", _LAYER_OUT + "attention.v_lin."),
            (LAYER + r"attention\.output\.dense\.", _LAYER_OUT + "attention.out_lin."),
            (LAYER + r"attention\.output\.LayerNorm\.", _LAYER_OUT + "sa_layer_norm."),
            (LAYER + r"intermediate\.dense\.", _LAYER_OUT + "ffn.lin1."),
            (LAYER + r"output\.dense\.", _LAYER_OUT + "ffn.lin2."),
            (LAYER + r"output\.LayerNorm\.", _LAYER_OUT + "output_layer_norm."),
            (r"^cls\.predictions\.transform\.dense\.", "vocab_transform."),
            (r"^cls\.predictions\.transform\.LayerNorm\.", "vocab_layer_norm."),
            (r"^cls\.predictions\.bias$", "vocab_projector.bias"),
            (r"^cls\.predictions\.decoder\.weight$", "vocab_projector.weight"),
            (r"^bert\.", "distilbert."),
        )),
    schema=ConfigSchema(
        checks=checks((("n_layers",), LAYERS), (("n_heads",), HEADS), (("dim",), WIDTH), (("hidden_dim",), FFN),
                       (("dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout"), RATE), base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config),
    defaults=Defaults(
        type_vocab_size=0,
        use_pooler=False),
    heads=Heads(
        hf_task_heads=("tag", "qa")))
