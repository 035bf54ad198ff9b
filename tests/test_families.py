"""The families package is the registry: a family is one file, found by itself (docs/architecture.md, "Adding a
family"). Proved by adding one to a copy of the package, with no other file touched: CamemBERT, RoBERTa's layout under
its own names, with its own masked-LM head activation, sequence-classification head layout, tokenizer (special
tokens, framing, files) and pretraining recipe, each a field of its file. The copy is checked against transformers'
own Camembert classes (encoder, masked LM, sequence classifier, tokenizer) on the same weights and texts."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bertforge.families import FAMILIES, Family

SRC = Path(__file__).resolve().parents[1] / "src"

CAMEMBERT = '''
"""CamemBERT (Martin et al. 2020): RoBERTa's layout and training for French, under its own names: a SentencePiece
(Unigram) tokenizer with RoBERTa's special tokens and framing, the masked-LM head's erf GELU whatever hidden_act
says, RoBERTa's classification head on <s>."""
from bertforge.families.family import (FIRST_TOKEN, CheckpointLayout, Defaults, Family, Heads, StackTraits,
                                       TokenizerLayout)
from bertforge.families.roberta import FAMILY as ROBERTA, LM_HEAD_RULES

# transformers' CamembertTokenizer: no normaliser, WhitespaceSplit + Metaspace, "<s> A </s></s> B </s>"
TOKENIZER = TokenizerLayout(
    model="unigram", specials={"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"},
    frame="double-sep", hf_class="CamembertTokenizer",
    special_map=(("bos_token", "cls"), ("eos_token", "sep"), ("unk_token", "unk"), ("sep_token", "sep"),
                 ("pad_token", "pad"), ("cls_token", "cls"), ("mask_token", "mask")),
    marker="<s>", normalise=False, cased=True, mask_lstrip=True)

RECIPES = (
    # Martin et al. 2020: RoBERTa's recipe (MLM, dynamic masks, full sentences) with whole-word masking and
    # SentencePiece
    dict(name="camembert", objective="mlm", masking="whole_word", dynamic=True, input_format="full-sentences",
         tokenizer_kind="camembert"),
)

FAMILY = Family("camembert", "Camembert", "roberta",
                head_classes={"mlm": "CamembertForMaskedLM"}, presets={"camembert-base": ("base", {})},
                recipes=RECIPES, tokenizer=TOKENIZER,
                checkpoint=CheckpointLayout(weight_rules=(*LM_HEAD_RULES, (r"^bert\\.", "roberta."))),
                schema=ROBERTA.schema,
                defaults=Defaults(vocab_size=32005, pad_token_id=1, max_position_embeddings=514, type_vocab_size=1,
                                  layer_norm_eps=1e-5),
                structure=StackTraits(positions_after_padding=True),
                heads=Heads(mlm_head_act="gelu", sequence_head=FIRST_TOKEN, single_segment=True))
'''

CHECK = '''
import torch
from transformers import (AutoTokenizer, CamembertForMaskedLM, CamembertForSequenceClassification,
                          CamembertModel)
from bertforge.config import preset
from bertforge.model import Encoder
from bertforge.model.heads import MaskedLM
from bertforge.pretraining.recipes import RECIPES
from bertforge.tasks.models import build_model, load_task_model, save_task_model
from bertforge.tokenization import Tokenizer

def close(a, b):
    assert (a - b).abs().max() < 1e-5, (a - b).abs().max()

texts = ["Le chat est sur le tapis.", "Une phrase en français, avec des accents : été, à, où.",
         "Les chiens aboient, la caravane passe."] * 40
tok = Tokenizer.train(texts, kind="camembert", vocab_size=200)
tok.save_pretrained(OUT + "/tok")
theirs = AutoTokenizer.from_pretrained(OUT + "/tok")
assert type(theirs).__name__ == "CamembertTokenizer", type(theirs)
for a, b in (("Le chat <mask> sur le tapis.", None), ("été à où", "Les chiens"), ("a b", "c d")):
    ours = tok([a], pairs=None if b is None else [b])["input_ids"][0].tolist()
    assert ours == theirs(a, b)["input_ids"], (ours, theirs(a, b)["input_ids"])
assert (tok.cls_token_id, tok.pad_token_id, tok.sep_token_id) == (0, 1, 2)
assert Tokenizer.from_pretrained(OUT + "/tok").kind == "camembert"

# hidden_act relu: the masked-LM head must still use erf GELU (the family's field), as CamembertForMaskedLM does
cfg = preset("camembert-base", num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
             vocab_size=tok.vocab_size, hidden_act="relu")
ids = torch.tensor([[0, 11, 12, 13, 2, 1, 1], [0, 21, 22, 23, 24, 25, 2]])
mask = (ids != 1).long()
torch.manual_seed(0)
enc = Encoder(cfg).eval()
enc.save_pretrained(OUT + "/enc")
with torch.no_grad():
    close(enc(input_ids=ids, attention_mask=mask).last_hidden_state,
          CamembertModel.from_pretrained(OUT + "/enc").eval()(input_ids=ids, attention_mask=mask).last_hidden_state)
back = Encoder.from_pretrained(OUT + "/enc")
assert back.config.model_type == "camembert"

mlm = MaskedLM(cfg).eval()
mlm.save_pretrained(OUT + "/mlm", tokenizer=tok)
ref, info = CamembertForMaskedLM.from_pretrained(OUT + "/mlm", output_loading_info=True)
assert not any(info[k] for k in ("missing_keys", "unexpected_keys")), info
with torch.no_grad():
    close(mlm(ids, mask), ref.eval()(input_ids=ids, attention_mask=mask).logits)

torch.manual_seed(1)
clf = build_model(cfg, "classify", 3).eval()
assert clf.architecture == "CamembertForSequenceClassification"
save_task_model(clf, OUT + "/clf", ["a", "b", "c"], {"name": "classify"}, tokenizer=tok)
ref, info = CamembertForSequenceClassification.from_pretrained(OUT + "/clf", output_loading_info=True)
assert not any(info[k] for k in ("missing_keys", "unexpected_keys")), info
loaded, _, labels = load_task_model(OUT + "/clf")
with torch.no_grad():
    theirs = ref.eval()(input_ids=ids, attention_mask=mask).logits
    close(clf(ids, mask)["logits"], theirs)
    close(loaded(ids, mask)["logits"], theirs)
assert labels == ["a", "b", "c"]
assert RECIPES["camembert"].model_type == "camembert" and RECIPES["camembert"].tokenizer_kind == "camembert"
print("ok")
'''


def test_every_family_file_is_registered():
    files = {p.stem for p in (SRC / "bertforge" / "families").glob("*.py")} - {"__init__", "family"}
    # the record's parts live in families/record/, which defines no family
    # a model_type's file is named for it, with "_" for "-" (deberta-v2: deberta_v2.py)
    assert files == {name.replace("-", "_") for name in FAMILIES}
    assert all(isinstance(f, Family) for f in FAMILIES.values())


def test_a_new_family_is_one_file(tmp_path):
    pytest.importorskip("transformers")
    src = tmp_path / "src"
    shutil.copytree(SRC / "bertforge", src / "bertforge", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "bertforge" / "families" / "camembert.py").write_text(textwrap.dedent(CAMEMBERT), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    code = f"OUT = {str(tmp_path / 'out')!r}\n" + CHECK
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_the_record_is_split_by_concern_into_small_parts():
    """Each part of a family's record reads at once, and a field's name says which part holds it (so
    `fam.sequence_head` is unambiguous)."""
    import dataclasses

    from bertforge.families.family import PARTS, part_fields

    sizes = {part: len(dataclasses.fields(Family.__dataclass_fields__[part].default)) for part in PARTS}
    assert max(sizes.values()) <= 16, sizes
    names = [f.name for part in PARTS for f in dataclasses.fields(Family.__dataclass_fields__[part].default)]
    assert len(names) == len(set(names)) == len(part_fields())
    assert not {f.name for f in dataclasses.fields(Family)} & set(names)
    bert = FAMILIES["bert"]
    assert bert.sequence_head is bert.heads.sequence_head and bert.vocab_size == bert.defaults.vocab_size == 30522
    with pytest.raises(AttributeError):
        bert.no_such_field


def test_a_familys_config_checks_live_in_its_file():
    """config.checks' table is the families' checks merged: a field of one family's schema is checked as its file
    says (Longformer's attention_window), a shared name the same way everywhere."""
    from bertforge.config.checks import FIELDS, check_fields
    from bertforge.errors import BertforgeError

    assert FIELDS["attention_window"] == FAMILIES["longformer"].schema.checks["attention_window"]
    assert "attention_window" not in FAMILIES["bert"].schema.checks
    for fam in FAMILIES.values():
        assert all(FIELDS[name] == spec for name, spec in fam.schema.checks.items())
    with pytest.raises(BertforgeError, match="config.json: attention_window must be in 2..1048576"):
        check_fields({"attention_window": [4, 1]}, "config.json")
