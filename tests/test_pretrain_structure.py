"""`bertforge pretrain --recipe xlnet / structbert` and `bertforge ablate` with their arms, end to end on a tiny
corpus: checkpoints transformers loads, each objective's own numbers, one-line refusals."""
from __future__ import annotations

import json
import os

import pytest

from bertforge.errors import BertforgeError
from test_pretrain_cli import TINY, corpus, run  # noqa: F401 (fixture)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_xlnet_recipe_end_to_end_and_continued_only_as_xlnet(corpus, tmp_path):  # noqa: F811
    from transformers import XLNetLMHeadModel
    out = tmp_path / "xl"
    assert run("pretrain", "--recipe", "xlnet", "--plm-k", "4", "--corpus", str(corpus), "--out", str(out),
               "--max-steps", "12", *TINY) == 0
    res = json.loads((out / "eval_results.json").read_text())
    assert res["recipe"]["objective"] == "plm" and res["recipe"]["plm_k"] == 4
    assert 0 <= res["heldout"]["plm_acc"] <= 1 and 0 <= res["heldout"]["mlm_acc"] <= 1
    assert res["fill_mask"] == []  # fill-mask refuses XLNet checkpoints; the report shows none either
    hf, info = XLNetLMHeadModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with pytest.raises(BertforgeError, match="cannot train --objective mlm"):
        run("pretrain", "--recipe", "roberta", "--init-from", str(out), "--corpus", str(corpus),
            "--out", str(tmp_path / "again"), "--max-steps", "2", *TINY)
    assert not (tmp_path / "again").exists()
    assert run("pretrain", "--recipe", "xlnet", "--init-from", str(out), "--corpus", str(corpus),
               "--out", str(tmp_path / "more"), "--max-steps", "1", "--seq-len", "600",
               *[a for a in TINY if a not in ("--seq-len", "32")]) == 0  # relative positions: no length limit


def test_structbert_recipe_end_to_end(corpus, tmp_path):  # noqa: F811
    from transformers import BertForMaskedLM
    out = tmp_path / "sb"
    assert run("pretrain", "--recipe", "structbert", "--corpus", str(corpus), "--out", str(out),
               "--max-steps", "12", *TINY) == 0
    res = json.loads((out / "eval_results.json").read_text())
    assert {"sso_acc", "wso_acc", "mlm_acc"} <= set(res["heldout"]) and res["fill_mask"]
    _, info = BertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"]


def test_ablate_with_structbert_and_xlnet_arms(corpus, tmp_path):  # noqa: F811
    from bertforge.pretraining.ablation import run_ablation
    res = run_ablation([str(corpus)], tmp_path / "abl", arms=["sso", "xlnet"], size="bert-tiny", seq_len=32,
                       batch_size=8, budget="1s", vocab_size=200)
    rows = {r["arm"]: r for r in res["rows"]}
    assert set(rows) == {"sso", "xlnet"} and "sso_acc" in rows["sso"] and "plm_acc" in rows["xlnet"]
    assert all(0 <= r["heldout_mlm_acc"] <= 1 and r["steps"] > 0 for r in rows.values())
    table = (tmp_path / "abl" / "ablation.md").read_text()
    assert "| xlnet | plm |" in table and "PLM" in table and "SSO" in table
