"""Label sets shared by fine-tuning and sentence-embedding training (GLUE/SNLI/MNLI order, as in HF datasets)."""

NLI2_LABELS = ("entailment", "not_entailment")
NLI3_LABELS = ("entailment", "neutral", "contradiction")  # an integer label in jsonl files indexes this tuple
NLI3_IDS = {name: i for i, name in enumerate(NLI3_LABELS)}
