"""ELECTRA (Clark et al. 2020): BERT's encoder without a pooler; E may be smaller than H (ELECTRA-Small). Its
pretraining checkpoints hold the replaced-token detector (`discriminator_predictions`) and, in the generator's
folder, the generator's MLM head (`generator_predictions` + `generator_lm_head`, erf GELU). transformers' ELECTRA
sequence-classification and multiple-choice heads differ from bertforge's (those are saved as bertforge's)."""
from bertforge.families.family import CheckpointLayout, Defaults, Family, Heads, StackTraits

# The pretraining objective (`--objective`) of replaced-token detection, named after the paper; `families.RTD_HOST`
# says ELECTRA's layout holds it for the encoders without one of their own.
RTD_OBJECTIVE = "electra"

RECIPES = (
    # Clark et al. 2020: replaced-token detection with a 1/4-size generator; twice BERT's learning rate
    # (2e-4 for ELECTRA-Base/Large vs BERT's 1e-4, Table 6).
    dict(name="electra", objective=RTD_OBJECTIVE, masking="token", dynamic=True, input_format="full-sentences",
         tokenizer_kind="wordpiece", lr_scale=2.0),
)

FAMILY = Family(
    "electra", "Electra", "electra",
    head_classes={"mlm": "ElectraForMaskedLM", "ltr": "ElectraForCausalLM", "rtd": "ElectraForPreTraining"},
    presets={"electra-small": ("mini", dict(num_hidden_layers=12, embedding_size=128)),  # Clark et al., Table 6
             "electra-base": ("base", {})},
    recipes=RECIPES,
    checkpoint=CheckpointLayout(
        weight_rules=(
            (r"^bert\.embeddings_project\.", "electra.embeddings_project."),
            (r"^cls\.predictions\.transform\.dense\.", "generator_predictions.dense."),
            (r"^cls\.predictions\.transform\.LayerNorm\.", "generator_predictions.LayerNorm."),
            (r"^cls\.predictions\.bias$", "generator_lm_head.bias"),
            (r"^cls\.predictions\.decoder\.weight$", "generator_lm_head.weight"),
            (r"^bert\.", "electra."),
        )),
    defaults=Defaults(
        use_pooler=False),
    structure=StackTraits(
        factorised=True,
        causal_encoder=True),
    heads=Heads(
        mlm_head_act="gelu",
        hf_task_heads=("tag", "qa")))
