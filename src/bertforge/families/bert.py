"""BERT (Devlin et al. 2019): the encoder every other family is a configuration of. bertforge's canonical tensor
names are BERT's (`bert.embeddings...`, `bert.encoder.layer.N...`, `cls.predictions...`), so it needs no rules;
its presets are the sizes themselves (`bert-tiny` ... `bert-large`, `config.sizes.SIZES`)."""
from bertforge.families.family import Family

FAMILY = Family("bert", "Bert", "bert", causal_encoder=True)
