"""The families package is the registry: a family is one file, found by itself (docs/architecture.md, "Adding a
family"). Proved by adding one (CamemBERT: RoBERTa's layout under its own names) to a copy of the package, with no
other file touched, and checking it against transformers' own CamembertModel on the same weights."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bertforge.families import FAMILIES, SEQ2SEQ_FAMILIES, Family, Seq2SeqFamily

SRC = Path(__file__).resolve().parents[1] / "src"

CAMEMBERT = '''
"""CamemBERT (Martin et al. 2020): RoBERTa's layout and training for French, under its own names."""
from bertforge.families.family import Family
from bertforge.families.roberta import LM_HEAD_RULES, config_json

FAMILY = Family("camembert", "Camembert", "roberta", write_config=config_json,
                weight_rules=(*LM_HEAD_RULES, (r"^bert\\.", "roberta.")), presets={"camembert-base": ("base", {})},
                vocab_size=32005, pad_token_id=1, max_position_embeddings=514, type_vocab_size=1,
                layer_norm_eps=1e-5, positions_after_padding=True)
'''

CHECK = '''
import torch
from transformers import CamembertModel
from bertforge.config import preset
from bertforge.model import Encoder

cfg = preset("camembert-base", num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
             vocab_size=300)
torch.manual_seed(0)
enc = Encoder(cfg).eval()
enc.save_pretrained(OUT)
ref = CamembertModel.from_pretrained(OUT).eval()
ids = torch.tensor([[0, 11, 12, 13, 2, 1, 1], [0, 21, 22, 23, 24, 25, 2]])
mask = (ids != 1).long()
with torch.no_grad():
    ours = enc(input_ids=ids, attention_mask=mask).last_hidden_state
    theirs = ref(input_ids=ids, attention_mask=mask).last_hidden_state
assert (ours - theirs).abs().max() < 1e-5, (ours - theirs).abs().max()
back = Encoder.from_pretrained(OUT)
assert back.config.model_type == "camembert"
print("ok", float((ours - theirs).abs().max()))
'''


def test_every_family_file_is_registered():
    files = {p.stem for p in (SRC / "bertforge" / "families").glob("*.py")} - {"__init__", "family"}
    # a model_type's file is named for it, with "_" for "-" (deberta-v2: deberta_v2.py)
    assert files == {name.replace("-", "_") for name in (*FAMILIES, *SEQ2SEQ_FAMILIES)}
    assert all(isinstance(f, Family) for f in FAMILIES.values())
    assert all(isinstance(f, Seq2SeqFamily) for f in SEQ2SEQ_FAMILIES.values())


def test_a_new_family_is_one_file(tmp_path):
    pytest.importorskip("transformers")
    src = tmp_path / "src"
    shutil.copytree(SRC / "bertforge", src / "bertforge", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "bertforge" / "families" / "camembert.py").write_text(textwrap.dedent(CAMEMBERT), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    code = f"OUT = {str(tmp_path / 'out')!r}\n" + CHECK
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]
