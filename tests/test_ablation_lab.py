"""The ablation lab (`bertforge ablate --table`): the left-to-right arm against transformers, the verdict rule on
hand-worked seeds, the FLOPs estimate by hand, and a whole (tiny) table run, continued after a loss, with its bad
inputs refused before any training."""
from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
import torch

from bertforge.config import ModelConfig, compose
from bertforge.errors import BertforgeError
from bertforge.lab.flops import encoder_forward_flops, training_flops_per_token, vocab_head_flops
from bertforge.lab.report import (INCONCLUSIVE, NOT_REPRODUCED, PENDING, REPRODUCED, gate_on_control, seed_scores,
                                  verdict)
from bertforge.lab.run import LabOptions, check_options, relation_accuracies, run_lab
from bertforge.lab.tables import CONTROL, TABLES, Claim
from bertforge.model import Encoder
from bertforge.pretraining.objectives import build_objective

WORDS = ("the cat dog bird fish sat ran flew swam on under near over a mat tree river house garden quickly slowly "
         "red green blue small big old young happy sad and but then because").split()


# ---- the left-to-right arm ------------------------------------------------------------------------------------------
def test_left_to_right_encoder_matches_transformers_bert_lm_head_model(tmp_path):
    from transformers import BertLMHeadModel
    torch.manual_seed(0)
    model = build_objective("ltr", compose("bert", "tiny", vocab_size=300)).eval()
    ids = torch.randint(5, 300, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["is_decoder"] is True and saved["architectures"] == ["BertLMHeadModel"]
    assert ModelConfig.from_file(tmp_path).causal
    hf = BertLMHeadModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        ours, ref = model.lm_logits(ids, mask), hf(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert torch.allclose(ours[real], ref[real], atol=1e-5)
    # left to right: a later token never changes an earlier position's prediction
    changed = ids.clone()
    changed[0, 7] = 9
    with torch.no_grad():
        again = model.lm_logits(changed, mask)
    assert torch.equal(again[0, :7], ours[0, :7]) and not torch.allclose(again[0, 7:], ours[0, 7:])


def test_left_to_right_pooler_reads_the_last_real_token():
    torch.manual_seed(0)
    enc = Encoder(compose("bert", "tiny", vocab_size=100, causal=True)).eval()
    ids = torch.randint(5, 100, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        out = enc(ids, mask)
        last = out.last_hidden_state[torch.tensor([0, 1]), torch.tensor([5, 2])]
        assert torch.allclose(out.pooler_output, torch.tanh(enc.pooler.dense(last)))


def test_causal_attention_is_refused_where_transformers_has_no_such_encoder():
    with pytest.raises(BertforgeError, match="causal"):
        compose("albert", "tiny", causal=True)


def test_left_to_right_objective_learns():
    torch.manual_seed(0)
    model = build_objective("ltr", compose("bert", "tiny", vocab_size=50))
    ids = torch.arange(5, 45).repeat(8, 1)  # a fixed sequence: perfectly predictable left to right
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        out = model(ids, torch.ones_like(ids))
        first = first if first is not None else float(out["loss"].detach())
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    assert float(out["loss"].detach()) < 0.3 * first and float(out["lm_acc"]) > 0.9


# ---- the verdict rule, by hand --------------------------------------------------------------------------------------
BETTER = Claim("a beats b", "a", "b")
CLOSE = Claim("a within 2 of b", "a", "b", tolerance=2.0)


@pytest.mark.parametrize("claim, a, b, expected", [
    (BETTER, [80.0, 82.0], [75.0, 78.0], REPRODUCED),       # every a above every b
    (BETTER, [70.0, 71.0], [75.0, 78.0], NOT_REPRODUCED),   # every a below every b
    (BETTER, [76.0, 80.0], [75.0, 78.0], INCONCLUSIVE),     # 76 < 78: inside the spread
    (BETTER, [90.0], [10.0], INCONCLUSIVE),                 # one seed: no spread measured
    (BETTER, [], [10.0, 11.0], PENDING),
    (CLOSE, [80.0, 81.0], [79.5, 80.5], REPRODUCED),        # largest gap 1.5
    (CLOSE, [80.0, 81.0], [85.0, 86.0], NOT_REPRODUCED),    # smallest gap 4
    (CLOSE, [80.0, 81.0], [82.5, 84.0], INCONCLUSIVE),      # gaps 1.5 .. 4
])
def test_verdict_rule(claim, a, b, expected):
    assert verdict(claim, a, b)["verdict"] == expected


def test_verdict_reports_means_spreads_and_welch_p_with_three_seeds():
    from scipy.stats import ttest_ind
    a, b = [80.0, 82.0, 81.0], [75.0, 78.0, 76.0]
    v = verdict(BETTER, a, b)
    assert v["a_mean"] == pytest.approx(81.0) and v["diff"] == pytest.approx(81.0 - statistics.fmean(b))
    assert v["a_std"] == pytest.approx(1.0) and v["welch_p"] == pytest.approx(ttest_ind(a, b, equal_var=False).pvalue)


@pytest.mark.parametrize("control, expected", [
    (REPRODUCED, [REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE]),      # pretraining matters: the seeds decide
    (INCONCLUSIVE, [INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE]),    # it does not yet: nothing is decided
    (NOT_REPRODUCED, [INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE]),
    (PENDING, [REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE]),         # the control has not run: nothing to gate on
])
def test_claims_wait_for_pretraining_to_beat_the_untrained_control(control, expected):
    claims = [{"a": "nsp", "b": CONTROL, "verdict": control}] + [
        {"a": "nsp", "b": "no-nsp", "verdict": v} for v in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)]
    gate_on_control(claims)
    assert claims[0]["verdict"] == control and [c["verdict"] for c in claims[1:]] == expected
    if control in (INCONCLUSIVE, NOT_REPRODUCED):
        assert claims[1]["seeds_say"] == REPRODUCED and "untrained control" in claims[1]["why"]
        assert "seeds_say" not in claims[3]


def test_seed_scores_average_the_claim_tasks_of_complete_seeds_only():
    records = {("a", 0): {"tasks": {"sst2": {"score": 0.8}, "mrpc": {"score": 0.6}}},
               ("a", 1): {"tasks": {"sst2": {"score": 0.9}}}}  # seed 1 has not finished mrpc
    assert seed_scores(records, "a", ["sst2", "mrpc"]) == {0: pytest.approx(70.0)}
    assert seed_scores(records, "a", ["sst2"]) == {0: pytest.approx(80.0), 1: pytest.approx(90.0)}


# ---- FLOPs by hand -------------------------------------------------------------------------------------------------
def test_flops_of_bert_base_by_hand():
    cfg = compose("bert", "base")
    h, i, v, t = 768, 3072, 30522, 128
    layer = 2 * (4 * h * h + 2 * h * i) + 4 * t * h
    assert encoder_forward_flops(cfg, t) == 12 * layer
    head = 2 * (h * h + h * v)
    assert vocab_head_flops(cfg) == head
    mlm = {"objective": "mlm+nsp", "mask_prob": 0.15, "model": cfg, "generator": None}
    assert training_flops_per_token(mlm, t) == pytest.approx(3 * (12 * layer + 0.15 * head))
    ltr = {**mlm, "objective": "ltr"}
    assert training_flops_per_token(ltr, t) == pytest.approx(3 * (12 * layer + head))
    # Kaplan et al.'s 6N: the matrix parameters of the 12 layers (85M) dominate at this length
    n = 12 * (4 * h * h + 2 * h * i)
    assert 6 * n < training_flops_per_token(mlm, t) < 1.5 * 6 * n


def test_flops_of_disentangled_attention_by_hand():
    """DeBERTa-base: BERT-base's layer plus c2p and p2c, each a [T, d] x [d, 2T - 1] product per head."""
    cfg = compose("deberta-v2", "base")
    h, i, t = 768, 3072, 128
    layer = 2 * (4 * h * h + 2 * h * i) + 4 * t * h + 2 * 2 * (2 * t - 1) * h
    assert encoder_forward_flops(cfg, t) == 12 * layer
    one_term = cfg.replace(relative_attention_terms=("c2p",))
    assert encoder_forward_flops(one_term, t) == 12 * (layer - 2 * (2 * t - 1) * h)


# ---- a whole table -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lab_inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lab")
    rng = random.Random(0)
    docs = [" ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))).capitalize() + "."
                     for _ in range(rng.randint(4, 7))) for _ in range(150)]
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    sst = root / "data" / "glue" / "SST-2"
    sst.mkdir(parents=True)
    for name, n in (("train", 48), ("dev", 24)):
        lines = ["sentence\tlabel"]
        for _ in range(n):
            y = rng.randint(0, 1)
            lines.append(" ".join(rng.choices(WORDS, k=4) + ["happy" if y else "sad"]) + f"\t{y}")
        (sst / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"corpus": corpus, "data": root / "data"}


def lab_options(inputs: dict[str, Path], out: Path, **over) -> LabOptions:
    return LabOptions(**{**dict(tables=["bert"], out=out, data_root=inputs["data"], corpus=[str(inputs["corpus"])],
                                steps=4, seeds=2, size="bert-tiny", seq_len=32, batch_size=8, vocab_size=200,
                                precision="fp32", threads=1, tasks=["sst2"], finetune_epochs=1), **over})


def test_a_table_runs_reports_and_continues_where_it_stopped(lab_inputs, tmp_path, capsys):
    out = tmp_path / "lab"
    reports = run_lab(lab_options(lab_inputs, out))
    rep = reports["bert"]
    assert set(rep["arms"]) == {"nsp", "no-nsp", "ltr", "untrained"}
    for name, arm in rep["arms"].items():
        assert arm["seeds"] == 2 and arm["tasks"]["sst2"]["n"] == 2
        if name == "untrained":  # the control: fine-tuned from random initialisation
            assert arm["steps"] == 0 and arm["flops"] == 0
        else:
            assert arm["steps"] == 4 and arm["flops"] > 0
    assert rep["arms"]["nsp"]["cross"].keys() == {"cross_nsp_acc", "cross_sop_acc"}  # ALBERT's cross-task scores
    assert rep["arms"]["ltr"]["heldout_mlm_acc"] is None and "lm_acc" in rep["arms"]["ltr"]["own"]
    control_claim, nsp_claim, ltr_claim = rep["claims"]
    assert control_claim["b"] == "untrained" and control_claim["verdict"] != PENDING
    assert nsp_claim["verdict"] == PENDING  # its tasks (sentence pairs) are not in this suite
    records = {(r["arm"], r["seed"]): r for r in (json.loads(p.read_text()) for p in (out / "results").glob("*"))}
    assert not [r["error"] for r in records.values() if "error" in r]  # a failed arm is recorded, not hidden
    expected = verdict(TABLES["bert"].claims[2], list(seed_scores(records, "no-nsp", ["sst2"]).values()),
                       list(seed_scores(records, "ltr", ["sst2"]).values()))
    assert ltr_claim["a_mean"] == pytest.approx(expected["a_mean"])
    assert ltr_claim.get("seeds_say", ltr_claim["verdict"]) == expected["verdict"]
    if control_claim["verdict"] != REPRODUCED:  # (4 steps of pretraining: the control decides)
        assert ltr_claim["verdict"] in (INCONCLUSIVE, PENDING)
    md = (out / "bert.md").read_text()
    assert "| ltr | LTR & No NSP | 2 | 4 |" in md and "a left-to-right LM is much worse than MLM" in md
    assert (out / "bert.png").stat().st_size > 0 and json.loads((out / "bert.json").read_text())["table"] == "bert"

    # a run stopped during seed 1's LTR fine-tuning: only that task runs again, the pretrained arm is kept
    record_file = out / "results" / "ltr-s1.json"
    record = json.loads(record_file.read_text())
    del record["tasks"]["sst2"]
    record_file.write_text(json.dumps(record))
    weights = out / "arms" / "ltr-s1" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    capsys.readouterr()
    run_lab(lab_options(lab_inputs, out))
    assert "6 pretraining runs of 4 steps (0 to run)" in capsys.readouterr().out
    assert weights.stat().st_mtime_ns == before
    assert "sst2" in json.loads(record_file.read_text())["tasks"]

    with pytest.raises(BertforgeError, match="--steps was 4 in the run being resumed, now 5"):
        run_lab(lab_options(lab_inputs, out, steps=5))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_relation_accuracies_score_a_sentence_head_on_both_tasks(precision):
    torch.manual_seed(0)
    cfg = compose("bert", "tiny", vocab_size=50, max_position_embeddings=16)
    model = build_objective("mlm+nsp", cfg)
    ids = torch.randint(5, 50, (4, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
             "sentence_label": torch.tensor([0, 1, 1, 0])}
    with torch.no_grad():  # scored without dropout, as relation_accuracies scores (in eval mode)
        model.eval()
        expected = model.cls.seq_relationship(model.bert(ids, batch["attention_mask"]).pooler_output).argmax(-1)
        model.train()
    scores = relation_accuracies(model, {"nsp": [batch], "sop": [batch, batch]}, precision)
    assert scores.keys() == {"cross_nsp_acc", "cross_sop_acc"}
    if precision == "fp32":  # (bf16 may flip a near-tie)
        assert scores["cross_nsp_acc"] == float((expected == batch["sentence_label"]).float().mean())
    assert 0.0 <= scores["cross_sop_acc"] <= 1.0 and model.training
    assert relation_accuracies(build_objective("mlm", cfg), {"nsp": [batch]}, precision) == {}


@pytest.mark.parametrize("over, message", [
    (dict(tables=["bert", "gpt"]), "--table: unknown gpt"),
    (dict(steps=None, budget="10s"), "--budget 10s: too small to pretrain"),
    (dict(tasks=["sst2", "mrpc"]), "no glue/MRPC folder (the mrpc data)"),
    (dict(tasks=["qqp"]), "--tasks: unknown 'qqp'"),
    (dict(seeds=0), "--seeds must be at least 1"),
])
def test_bad_input_is_refused_before_any_training(lab_inputs, tmp_path, over, message):
    out = tmp_path / "never"
    with pytest.raises(BertforgeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_lab(lab_options(lab_inputs, out, **over))
    assert not out.exists()


def test_missing_downstream_folder_is_named(lab_inputs, tmp_path):
    with pytest.raises(BertforgeError, match="--downstream .*nowhere: no such folder"):
        check_options(lab_options(lab_inputs, tmp_path / "x", data_root=tmp_path / "nowhere"))


def test_every_arm_is_a_valid_recipe_and_every_table_arm_exists():
    from bertforge.pretraining.ablation import ARMS
    from bertforge.pretraining.recipes import resolve
    for arm in ARMS.values():
        resolve(arm["recipe"], **arm["over"])
    for table in TABLES.values():
        if table.kind != "pretrain":  # the realm table's arms are its own (tests/test_lab_realm_table.py)
            continue
        assert set(table.arms) - {CONTROL} <= set(ARMS) and all({c.a, c.b} <= set(table.arms) for c in table.claims)
        assert CONTROL in table.arms and table.claims[0].b == CONTROL
        assert set(table.flops_matched.values()) <= set(table.arms)
