"""Configurations: `ModelConfig` for the encoders and the GPT-2 decoder (`model.py`), `Seq2SeqConfig` for T5 and
BART (`seq2seq.py`), what they share about config.json (`hf.py`: the one reader of the file, the family's schema,
the check against the weights), the one table of shapes (`sizes.py`) and the long-attention settings (`long.py`).
Each is
composed as a size x a family (`bertforge.families`): `compose("albert", "base")`, `preset("roberta-base")`.

Import the public names from here (`from bertforge.config import ModelConfig, compose, preset`); modules inside
this package import from their siblings.
"""
from bertforge.config.hf import check_against_weights, config_from_dict, read_config_json
from bertforge.config.model import CAUSAL_ENCODERS, PRESETS, ModelConfig, compose, preset
from bertforge.config.seq2seq import Seq2SeqConfig, compose_seq2seq, seq2seq_preset
from bertforge.config.sizes import SIZES, Size

__all__ = ["CAUSAL_ENCODERS", "PRESETS", "SIZES", "ModelConfig", "Seq2SeqConfig", "Size", "check_against_weights",
           "compose", "compose_seq2seq", "config_from_dict", "preset", "read_config_json", "seq2seq_preset"]
