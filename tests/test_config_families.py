"""One family table, one size table: presets, recipes, checkpoint names and task class names all read them."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import bertforge.model.checkpoint as checkpoint
from bertforge.families import DECODER, ENCODER_DECODER, FAMILIES
from bertforge.config import PRESETS, ModelConfig, compose, preset
from bertforge.config.sizes import SIZES
from bertforge.errors import BertforgeError
from bertforge.pretraining.recipes import RECIPES
from bertforge.pretraining.recipes import SIZE_NAMES as SIZE_FLAGS

# ModelConfig fields a family fixes, as (config field, Family field)
FAMILY_FIELDS = [("type_vocab_size", "type_vocab_size"), ("layer_norm_eps", "layer_norm_eps"),
                 ("hidden_act", "hidden_act"), ("hidden_dropout_prob", "dropout"),
                 ("attention_probs_dropout_prob", "dropout"), ("use_pooler", "use_pooler")]


def test_presets_are_size_times_family_with_their_published_values():
    # hand-written from the papers / HF configs (the values the presets had before the tables existed)
    assert dataclasses.astuple(preset("bert-base")) == dataclasses.astuple(ModelConfig())
    rob = preset("roberta-base")
    assert (rob.vocab_size, rob.pad_token_id, rob.max_position_embeddings, rob.type_vocab_size,
            rob.layer_norm_eps, rob.position_offset) == (50265, 1, 514, 1, 1e-5, 2)
    alb = preset("albert-large")
    assert (alb.num_hidden_layers, alb.hidden_size, alb.embedding_size, alb.share_layers, alb.vocab_size,
            alb.hidden_act, alb.hidden_dropout_prob) == (24, 1024, 128, "all", 30000, "gelu_new", 0.0)
    dist = preset("distilbert-base")
    assert (dist.num_hidden_layers, dist.hidden_size, dist.type_vocab_size, dist.use_pooler) == (6, 768, 0, False)
    small = preset("electra-small")
    assert (small.num_hidden_layers, small.hidden_size, small.num_attention_heads, small.intermediate_size,
            small.embedding_size, small.use_pooler) == (12, 256, 4, 1024, 128, False)
    assert preset("bert-medium", vocab_size=99).vocab_size == 99  # overrides win
    for name, (family, size, fixed) in PRESETS.items():
        cfg = preset(name)
        for field, fam_field in FAMILY_FIELDS:
            if field not in fixed:
                assert getattr(cfg, field) == getattr(FAMILIES[family], fam_field), (name, field)
        if "num_hidden_layers" not in fixed:
            assert cfg.num_hidden_layers == SIZES[size].layers
    with pytest.raises(BertforgeError, match="unknown model size 'bert-huge'"):
        preset("bert-huge")
    with pytest.raises(BertforgeError, match="unknown model family"):
        compose("gpt", "base")


@pytest.mark.parametrize("recipe", [r for r in RECIPES  # (T5 / BART:
                                    if FAMILIES[RECIPES[r].model_type].stack != ENCODER_DECODER])
def test_every_recipe_takes_its_family_settings_from_the_table(recipe):  # config.seq2seq, tests/test_seq2seq_*)
    r = RECIPES[recipe]
    fam = FAMILIES[r.model_type]
    for size in SIZE_FLAGS:
        cfg = r.model_config(size, vocab_size=500, pad_token_id=fam.pad_token_id, seq_len=128)
        for field, fam_field in FAMILY_FIELDS:
            assert getattr(cfg, field) == getattr(fam, fam_field), (recipe, size, field)
        shape = SIZES[size.removeprefix("bert-")]
        assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == \
            (shape.layers, shape.hidden, fam.intermediate(shape.intermediate))
        # encoders get 512 positions (for longer fine-tuning inputs); a decoder's context is what it trains on
        context = 128 if fam.stack == DECODER else 512 + cfg.position_offset
        assert cfg.vocab_size == 500 and cfg.max_position_embeddings == context


def test_albert_recipe_and_preset_agree():
    """The disagreement that motivated the single table: the ALBERT recipe trained with gelu, the preset gelu_new."""
    from_recipe = RECIPES["albert"].model_config("bert-base", vocab_size=30000, pad_token_id=0, seq_len=128)
    from_preset = preset("albert-base")
    for field in ("hidden_act", "embedding_size", "share_layers", "hidden_dropout_prob", "layer_norm_eps",
                  "num_hidden_layers", "hidden_size", "vocab_size"):
        assert getattr(from_recipe, field) == getattr(from_preset, field), field
    assert from_recipe.hidden_act == "gelu_new"
    # the recipe's ablation knobs still override the family
    knob = RECIPES["albert"].with_(embedding_size=64, share_layers="none")
    cfg = knob.model_config("bert-mini", vocab_size=100, pad_token_id=0, seq_len=64)
    assert (cfg.embedding_size, cfg.share_layers) == (64, "none")


def test_hf_names_come_from_the_family_table():
    from bertforge.tasks.models import QuestionAnswering, SequenceClassifier
    prefixes = {name: fam.weight_prefix for name, fam in FAMILIES.items() if fam.stack != ENCODER_DECODER}
    assert prefixes == {"bert": "bert", "roberta": "roberta", "albert": "albert", "distilbert": "distilbert",
                        "electra": "electra", "xlnet": "transformer", "gpt2": "transformer", "modernbert": "model",
                        "longformer": "longformer", "big_bird": "bert", "xlm-roberta": "roberta",
                        "deberta-v2": "deberta", "dpr": ""}  # DPR: no bare layout, its towers' names carry it
    assert FAMILIES["distilbert"].base_architecture == "DistilBertModel"
    assert FAMILIES["t5"].base_architecture == "T5ForConditionalGeneration"
    for name, fam in FAMILIES.items():
        if fam.stack != ENCODER_DECODER and fam.architecture is None:
            assert fam.base_architecture == fam.hf_prefix + "Model"
    # a task model's class: transformers' where it has bertforge's layout, else bertforge's own name
    cfg = preset("roberta-base", num_hidden_layers=1)
    assert SequenceClassifier(cfg, 2).architecture == "RobertaForSequenceClassification"
    distil = preset("distilbert-base", num_hidden_layers=1)
    assert SequenceClassifier(distil, 2).architecture == "BertforgeSequenceClassifier"
    assert QuestionAnswering(distil).architecture == "DistilBertForQuestionAnswering"
    assert QuestionAnswering(preset("modernbert-base", num_hidden_layers=1)).architecture == \
        "BertforgeQuestionAnswering"


def test_checkpoint_does_not_import_model():
    """model imports checkpoint (save/load); checkpoint must not import model back, not even inside a function."""
    tree = ast.parse(Path(checkpoint.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.startswith(("bertforge.model", "bertforge.model.heads")) for m in imported), imported


def test_bare_encoder_is_told_apart_from_a_wrapper(tmp_path):
    from bertforge.model.heads import MaskedLM
    from bertforge.model import Encoder
    cfg = preset("bert-tiny", vocab_size=60, num_hidden_layers=1)
    enc, mlm = Encoder(cfg), MaskedLM(cfg)
    assert checkpoint.is_bare_encoder(enc) and not checkpoint.is_bare_encoder(mlm)
    assert "embeddings.word_embeddings.weight" in checkpoint.hf_state_dict(enc, cfg)  # saved like BertModel
    assert "bert.embeddings.word_embeddings.weight" in checkpoint.hf_state_dict(mlm, cfg)
