"""The families added as `docs/architecture.md` says a family is added (XLM-RoBERTa, DeBERTa-v2/v3): on the same
random weights in fp32, the bare encoder, the MLM and the sequence classifier give transformers' outputs to 1e-5,
and checkpoints go both ways whole (saved by bertforge, they load in transformers' classes with no missing or
unexpected keys; saved by transformers, they load in bertforge with nothing left initialised)."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from bertforge.config import ModelConfig
from bertforge.families import FAMILIES
from bertforge.families.family import OWN_POOLER
from bertforge.model import Encoder
from bertforge.model.checkpoint import load_pretrained
from bertforge.model.heads import MaskedLM
from bertforge.tasks.models import build_model, init_from_pretrained, load_task_model, save_task_model

from test_model_parity import _batch as batch  # three rows, two of them padded

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

SHAPE = dict(vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48)
CONFIGS = {
    "xlm-roberta": ModelConfig(model_type="xlm-roberta", pad_token_id=1, type_vocab_size=1, use_pooler=False,
                               max_position_embeddings=66, **SHAPE),
    # 8 buckets: distances past 4 are log-bucketed in a 12-token batch
    "deberta-v2": ModelConfig(**{**FAMILIES["deberta-v2"].settings(), **SHAPE, "max_position_embeddings": 64},
                              position_buckets=8, max_relative_positions=32),
}
HF_PREFIX = {"xlm-roberta": "XLMRoberta", "deberta-v2": "DebertaV2"}
BARE = {"xlm-roberta": dict(add_pooling_layer=False), "deberta-v2": {}}  # the bare model's own arguments


def randomise(model: torch.nn.Module) -> None:
    """Non-trivial norms and biases, so a mapping that drops one cannot pass."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def ours_saved(cls, cfg: ModelConfig, path):
    """bertforge's `cls` of `cfg`, randomly initialised (norms and biases perturbed) and saved at `path`."""
    torch.manual_seed(0)
    ours = cls(cfg).eval()
    randomise(ours)
    ours.save_pretrained(path)
    return ours


def close_on_real_tokens(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> None:
    real = mask.bool()
    if ours.dim() >= 2 and ours.shape[:2] == real.shape:
        ours, theirs = ours[real], theirs[real]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def hf_class(model_type: str, suffix: str):
    return getattr(transformers, HF_PREFIX[model_type] + suffix)


def loaded_whole(cls, path, **kwargs):
    """transformers' `cls` read from `path`, with no missing and no unexpected key."""
    ref, info = cls.from_pretrained(path, output_loading_info=True, **kwargs)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return ref.eval()


def their_random(cls, hf_config: dict, path, **kwargs):
    """transformers' own randomly initialised `cls` (norms and biases perturbed), saved at `path`."""
    torch.manual_seed(1)
    ref = cls(transformers.AutoConfig.for_model(**hf_config), **kwargs).eval()
    randomise(ref)
    ref.save_pretrained(path)
    return ref


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_encoder_both_ways(tmp_path, model_type):
    cfg = CONFIGS[model_type]
    ours = ours_saved(Encoder, cfg, tmp_path / "ours")
    ref = loaded_whole(hf_class(model_type, "Model"), tmp_path / "ours", **BARE[model_type])
    b = batch(cfg)
    with torch.no_grad():
        mine, theirs = ours(**b, output_hidden_states=True), ref(**b, output_hidden_states=True)
    assert len(mine.hidden_states) == len(theirs.hidden_states) == cfg.num_hidden_layers + 1
    for a, h in zip(mine.hidden_states, theirs.hidden_states):
        close_on_real_tokens(a, h, b["attention_mask"])
    # transformers' own random model, read by bertforge with nothing left initialised
    ref = their_random(hf_class(model_type, "Model"), cfg.to_hf_dict(), tmp_path / "theirs", **BARE[model_type])
    back = Encoder.from_pretrained(tmp_path / "theirs")
    with torch.no_grad():
        close_on_real_tokens(back(**b).last_hidden_state, ref(**b).last_hidden_state, b["attention_mask"])


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_masked_lm_both_ways(tmp_path, model_type):
    cfg = CONFIGS[model_type]
    ours = ours_saved(MaskedLM, cfg, tmp_path / "ours")
    cls = hf_class(model_type, "ForMaskedLM")
    ref = loaded_whole(cls, tmp_path / "ours")
    b = batch(cfg)
    with torch.no_grad():
        close_on_real_tokens(ours(**b), ref(**b).logits, b["attention_mask"])
    ref = their_random(cls, cfg.to_hf_dict(), tmp_path / "theirs")
    back = MaskedLM(ModelConfig.from_file(tmp_path / "theirs"))
    assert load_pretrained(back, tmp_path / "theirs") == []
    with torch.no_grad():
        close_on_real_tokens(back.eval()(**b), ref(**b).logits, b["attention_mask"])


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_sequence_classifier_both_ways(tmp_path, model_type):
    cfg = CONFIGS[model_type]
    torch.manual_seed(0)
    Encoder(cfg).save_pretrained(tmp_path / "base")
    model, missing = init_from_pretrained(tmp_path / "base", "classify", 3)
    # only the head is new (DeBERTa's head owns its pooler: DebertaV2Model has none)
    assert missing and all(not m.startswith("bert.") or m.startswith("bert.pooler.") for m in missing), missing
    randomise(model)
    save_task_model(model, tmp_path / "ours", ["a", "b", "c"], {"name": "t"})
    cls = hf_class(model_type, "ForSequenceClassification")
    ref = loaded_whole(cls, tmp_path / "ours")
    b = batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**b)["logits"], ref(**b).logits, atol=1e-5, rtol=0)
        again, task, labels = load_task_model(tmp_path / "ours")
        torch.testing.assert_close(again(**b)["logits"], ref(**b).logits, atol=1e-5, rtol=0)
    assert labels == ["a", "b", "c"]
    ref = their_random(cls, {**cfg.to_hf_dict(), "num_labels": 2}, tmp_path / "theirs")
    back = build_model(ModelConfig.from_file(tmp_path / "theirs"), "classify", 2)
    assert load_pretrained(back, tmp_path / "theirs") == []
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(**b)["logits"], ref(**b).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("kind,suffix,n", [("tag", "ForTokenClassification", 4), ("qa", "ForQuestionAnswering", 2),
                                           ("choice", "ForMultipleChoice", 1)])
def test_other_task_heads_load_in_transformers(tmp_path, model_type, kind, suffix, n):
    cfg = CONFIGS[model_type]
    torch.manual_seed(0)
    # a pretrained pooler where the family's checkpoints have one (XLM-R's multiple choice reads it)
    Encoder(cfg.replace(use_pooler=cfg.family.sequence_head != OWN_POOLER)).save_pretrained(tmp_path / "base")
    model, _ = init_from_pretrained(tmp_path / "base", kind, n)
    randomise(model)
    save_task_model(model, tmp_path / "ours", [f"L{i}" for i in range(n)] if kind == "tag" else None, {"name": "t"})
    ref = loaded_whole(hf_class(model_type, suffix), tmp_path / "ours")
    b = batch(cfg)
    if kind == "choice":
        b = {k: torch.stack([v, v.flip(0)], 1).contiguous() for k, v in b.items()}  # [3 examples, 2 choices, T]
    with torch.no_grad():
        ours, theirs = model.eval()(**b), ref(**b)
    for key in ("start_logits", "end_logits") if kind == "qa" else ("logits",):
        mask = b["attention_mask"] if kind != "choice" else torch.ones(1)
        close_on_real_tokens(ours[key], getattr(theirs, key), mask)


def test_deberta_reads_past_its_max_position_embeddings_as_transformers(tmp_path):
    """The positions rule: DeBERTa's positions are relative, distances past the buckets share the outermost one, so
    no length is refused (transformers' DebertaV2Model refuses none either); 100 tokens through a model of 64
    positions and 8 buckets give transformers' states."""
    from bertforge.config.positions import check_length, position_limit

    cfg = CONFIGS["deberta-v2"]
    assert position_limit(cfg) is None and check_length(100, cfg, tmp_path, "--max-seq-len") == 100
    ours = ours_saved(Encoder, cfg, tmp_path)
    ref = loaded_whole(transformers.DebertaV2Model, tmp_path)
    b = batch(cfg, length=100)
    with torch.no_grad():
        close_on_real_tokens(ours(**b).last_hidden_state, ref(**b).last_hidden_state, b["attention_mask"])


def test_xlm_roberta_recipe_pretrains_a_transformers_checkpoint(tmp_path):
    """`pretrain --recipe xlm-roberta` (the family file's recipe: RoBERTa's, with XLM-R's own tokenizer layout)
    writes a tokenizer AutoTokenizer loads as XLMRobertaTokenizer and a model XLMRobertaForMaskedLM loads whole."""
    import random

    from bertforge.cli import main
    from bertforge.tokenization import Tokenizer

    rng = random.Random(0)
    (tmp_path / "c.txt").write_text("\n\n".join(" ".join(rng.choices(TEXTS, k=3)) for _ in range(60)),
                                    encoding="utf-8")
    assert main(["pretrain", "--recipe", "xlm-roberta", "--corpus", str(tmp_path / "c.txt"), "--size", "bert-tiny",
                 "--seq-len", "32", "--batch-size", "8", "--max-steps", "2", "--vocab-size", "120", "--precision",
                 "fp32", "--no-progress", "--out", str(tmp_path / "run")]) == 0
    tok = Tokenizer.from_pretrained(tmp_path / "run")
    assert tok.kind == "xlm-roberta" and tok.mask_token_id == tok.vocab_size - 1
    assert type(transformers.AutoTokenizer.from_pretrained(tmp_path / "run")).__name__ == "XLMRobertaTokenizer"
    model = loaded_whole(transformers.XLMRobertaForMaskedLM, tmp_path / "run")
    assert model.config.model_type == "xlm-roberta"


def test_deberta_attention_maps_are_transformers(tmp_path):
    cfg = CONFIGS["deberta-v2"]
    ours = ours_saved(Encoder, cfg, tmp_path)
    ref = loaded_whole(transformers.DebertaV2Model, tmp_path)
    b = batch(cfg)
    with torch.no_grad():
        mine, theirs = ours(**b, output_attentions=True), ref(**b, output_attentions=True)
    real = b["attention_mask"].bool()
    for a, h in zip(mine.attentions, theirs.attentions, strict=True):
        rows = real[:, None, :, None].expand_as(a)
        torch.testing.assert_close(a[rows], h[rows], atol=1e-5, rtol=0)


def test_deberta_legacy_mlm_head_reads_and_is_written_in_the_new_layout(tmp_path):
    """transformers' default (`legacy`: the cls.predictions.* names) loads; bertforge writes lm_predictions.*,
    the layout of Microsoft's checkpoints, and says legacy: false."""
    cfg = CONFIGS["deberta-v2"]
    hf_dict = {k: v for k, v in cfg.to_hf_dict().items() if k != "legacy"}
    ref = their_random(transformers.DebertaV2ForMaskedLM, hf_dict, tmp_path / "legacy")
    assert ref.config.legacy
    ours = MaskedLM.from_pretrained(tmp_path / "legacy")
    b = batch(cfg)
    with torch.no_grad():
        close_on_real_tokens(ours(**b), ref(**b).logits, b["attention_mask"])
    ours.save_pretrained(tmp_path / "new")
    new = loaded_whole(transformers.DebertaV2ForMaskedLM, tmp_path / "new")
    assert not new.config.legacy
    with torch.no_grad():
        close_on_real_tokens(new(**b).logits, ref(**b).logits, b["attention_mask"])


@pytest.mark.parametrize("field,value,says", [
    ("position_biased_input", True, "absolute positions added to the input"),
    ("relative_attention", False, "without relative attention"),
    ("conv_kernel_size", 3, "convolution beside the first layer"),
    # the field table (config.checks) reads DeBERTa's fields by type and range before the family does
    ("pos_att_type", 7, "pos_att_type must be text or a list of texts"),
    ("position_buckets", "256", "position_buckets must be a whole number"),
    ("max_relative_positions", -5, r"max_relative_positions must be in -1\.\.1048576"),
    ("share_att_key", "yes", "share_att_key must be true or false"),
])
def test_deberta_configs_bertforge_does_not_compute_are_one_line(tmp_path, field, value, says):
    import json

    from bertforge.errors import BertforgeError
    d = {**CONFIGS["deberta-v2"].to_hf_dict(), field: value}
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(BertforgeError, match=says) as err:
        ModelConfig.from_file(tmp_path)
    assert str(tmp_path / "config.json") in str(err.value) and "\n" not in str(err.value)


# ---- the families' SentencePiece tokenizers ----------------------------------------------------------------------
TEXTS = ["The quick brown fox jumps over the lazy dog, twice.", "Der schnelle braune Fuchs springt über den Hund.",
         "El zorro marrón salta sobre el perro perezoso.", "Le renard brun saute par-dessus le chien paresseux."]
FIRST = {"deberta-v2": ["[PAD]", "[CLS]", "[SEP]", "[UNK]"], "xlm-roberta": ["<s>", "<pad>", "</s>", "<unk>"]}
MASK = {"deberta-v2": "[MASK]", "xlm-roberta": "<mask>"}


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_tokenizer_train_family_layout_encodes_as_transformers(tmp_path, model_type):
    """`bertforge tokenizer train --kind X` writes the family's own layout (its special tokens at 0-3, the mask
    token last), which transformers' AutoTokenizer loads as the family's class and encodes identically."""
    from bertforge.cli import main
    from bertforge.tokenization import Tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(t + "  " + t.lower() for t in TEXTS * 20), encoding="utf-8")
    assert main(["tokenizer", "train", "--corpus", str(corpus), "--kind", model_type, "--vocab-size", "300",
                 "--out", str(tmp_path / "tok")]) == 0
    ours = Tokenizer.from_pretrained(tmp_path / "tok")  # recognised by its tokenizer_config.json's class
    assert ours.kind == model_type and ours.layout is FAMILIES[model_type].tokenizer
    import pickle
    assert pickle.loads(pickle.dumps(ours)).layout is ours.layout  # workers (corpus preparation) keep the layout
    assert [ours.token_to_id(t) for t in FIRST[model_type]] == [0, 1, 2, 3]
    assert ours.mask_token == MASK[model_type] and ours.mask_token_id == ours.vocab_size - 1 > 60
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert type(hf).__name__ == HF_PREFIX[model_type] + "Tokenizer"
    samples = [*TEXTS, f"a {MASK[model_type]} in  the\tmiddle ", "Ünïcödé  spaces\nand NEWLINES"]
    for text in samples:
        assert ours([text], return_tensors=None)["input_ids"][0] == hf(text)["input_ids"], text
    pair_ours = ours([TEXTS[0]], [TEXTS[1]], return_tensors=None)
    pair_hf = hf(TEXTS[0], TEXTS[1])
    assert pair_ours["input_ids"][0] == pair_hf["input_ids"]
    if "token_type_ids" in pair_hf:
        assert pair_ours["token_type_ids"][0] == pair_hf["token_type_ids"]
    # build_inputs (pretraining rows, SQuAD windows) joins ids as the post-processor does
    a, b = ours.encode_ids([TEXTS[0], TEXTS[1]])
    assert ours.build_inputs(a, b) == (pair_ours["input_ids"][0], pair_ours["token_type_ids"][0])


def test_a_converter_written_deberta_tokenizer_json_loads(tmp_path):
    """A tokenizer.json as transformers' DebertaV2Converter writes it for Microsoft's spm.model (Unigram with [PAD]
    [CLS] [SEP] [UNK] at 0-3 and [MASK] at the end; Strip + Replace normaliser, Metaspace, the [CLS] A [SEP] B [SEP]
    template), built here with `tokenizers`: bertforge reads its layout and encodes single texts and pairs as
    transformers' DebertaV2Tokenizer does."""
    import json

    from tokenizers import Regex, Tokenizer as Backend, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import Unigram

    from bertforge.tokenization import Tokenizer

    pieces = ["▁the", "▁cat", "▁sat", "▁on", "▁a", "▁mat", "▁dog", "s", "▁", *"thecamon"]
    vocab = ([("[PAD]", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[UNK]", 0.0)]
             + [(p, -1.0 - i / 10) for i, p in enumerate(pieces)] + [("[MASK]", 0.0)])
    backend = Backend(Unigram(vocab, unk_id=3))
    backend.normalizer = normalizers.Sequence([normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")])
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    backend.add_special_tokens(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": False, "bos_token": "[CLS]", "eos_token": "[SEP]",
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]", "split_by_punct": False, "vocab_type": "spm"}))
    ours = Tokenizer.from_pretrained(tmp_path)
    assert ours.kind == "deberta-v2" and ours.layout.hf_class == "DebertaV2Tokenizer"
    assert (ours.pad_token_id, ours.cls_token_id, ours.sep_token_id, ours.unk_token_id, ours.mask_token_id) == \
        (0, 1, 2, 3, len(vocab) - 1)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for a, b in [("the cat sat on a mat", None), ("the dogs sat", "on the [MASK]"), ("a cat", "the mat")]:
        mine = ours([a], None if b is None else [b], return_tensors=None)
        theirs = hf(a, b)
        assert mine["input_ids"][0] == theirs["input_ids"] and mine["token_type_ids"][0] == theirs["token_type_ids"]
    ids_a, ids_b = ours.encode_ids(["the cat", "a mat"])
    pair = hf("the cat", "a mat")
    assert ours.build_inputs(ids_a, ids_b) == (pair["input_ids"], pair["token_type_ids"])
