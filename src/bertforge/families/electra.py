"""ELECTRA (Clark et al. 2020): BERT's encoder without a pooler; E may be smaller than H (ELECTRA-Small). The
generator's MLM head is `generator_predictions` + `generator_lm_head`."""
from bertforge.families.family import Family

FAMILY = Family(
    "electra", "Electra", "electra",
    weight_rules=(
        (r"^bert\.embeddings_project\.", "electra.embeddings_project."),
        (r"^cls\.predictions\.transform\.dense\.", "generator_predictions.dense."),
        (r"^cls\.predictions\.transform\.LayerNorm\.", "generator_predictions.LayerNorm."),
        (r"^cls\.predictions\.bias$", "generator_lm_head.bias"),
        (r"^cls\.predictions\.decoder\.weight$", "generator_lm_head.weight"),
        (r"^bert\.", "electra."),
    ),
    presets={"electra-small": ("mini", dict(num_hidden_layers=12, embedding_size=128)),  # Clark et al., Table 6
             "electra-base": ("base", {})},
    use_pooler=False, factorised=True, causal_encoder=True, lm_head_activation="gelu")
