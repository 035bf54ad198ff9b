"""`--recipe modern` (ModernBERT's recipe): its fields, its warm-up / stable / 1-sqrt-decay schedule against
transformers' `get_wsd_schedule`, packed rows without padding at 30% masking, and a tiny end-to-end run whose loss
falls and whose checkpoint transformers' ModernBertForMaskedLM loads with the same predictions."""
from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from torch import nn

from bertforge.commands import pretrain as cmd
from bertforge.config.sizes import SIZES
from bertforge.errors import BertforgeError
from bertforge.pretraining.ablation import ARMS
from bertforge.pretraining.recipes import RECIPES, resolve
from bertforge.training import TrainConfig, WarmupStableDecay, build_schedule

WORDS = ("the cat dog bird fish sat ran flew swam on under near over a mat tree river house garden quickly slowly "
         "red green blue small big old young happy sad and but then because").split()
TINY = ["--size", "bert-tiny", "--seq-len", "32", "--batch-size", "8", "--vocab-size", "200", "--no-progress",
        "--heldout-fraction", "0.1", "--eval-batches", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    docs = [" ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))).capitalize() + "."
                     for _ in range(rng.randint(4, 7))) for _ in range(150)]
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="bertforge")
    cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_modern_recipe_is_modernberts():
    m = RECIPES["modern"]
    assert (m.objective, m.masking, m.mask_prob, m.dynamic, m.input_format, m.tokenizer_kind, m.model_type,
            m.schedule) == ("mlm", "token", 0.3, True, "full-sentences", "bpe", "modernbert", "wsd")
    cfg = m.model_config("bert-mini", vocab_size=1000, pad_token_id=1, seq_len=128)
    assert (cfg.norm_position, cfg.position_embedding_type, cfg.gated_mlp, cfg.attention_bias, cfg.use_pooler,
            cfg.type_vocab_size) == ("pre", "rotary", True, False, False, 0)
    # the GeGLU width keeps bert-mini's MLP parameter count (2 x 704 + 704 ~ 2 x 1024)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (4, 256, 704)
    for size, shape in SIZES.items():
        assert m.default_lr(f"bert-{size}") == pytest.approx(2 * shape.pretrain_lr)
    assert ARMS["modern"]["recipe"] == "modern" and ARMS["roberta"]["recipe"] == "roberta"
    assert resolve("modern", mask_prob=0.15).mask_prob == 0.15  # one flag, one arm
    assert resolve("modern", schedule="linear").schedule == "linear"
    assert resolve("bert", schedule=None).schedule == "linear"


@pytest.mark.parametrize("over,msg", [(dict(mask_prob=1.2), "--mask-prob: must be between 0 and 1"),
                                      (dict(schedule="cosine"), "--schedule: unknown 'cosine'")])
def test_bad_modern_flags_fail_with_one_line(over, msg):
    with pytest.raises(BertforgeError, match=msg):
        resolve("modern", **over)


def test_wsd_schedule_matches_transformers():
    sched = WarmupStableDecay(total=100, warmup_steps=10, decay_ratio=0.2)
    expected = {0: 0.0, 5: 0.5, 10: 1.0, 50: 1.0, 80: 1.0, 85: 0.5, 100: 0.0, 120: 0.0}
    for step, value in expected.items():
        assert sched(step) == pytest.approx(value)
    from transformers.optimization import get_wsd_schedule

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_wsd_schedule(opt, num_warmup_steps=7, num_decay_steps=10, num_training_steps=50, decay_type="1-sqrt")
    mine = build_schedule(TrainConfig(out_dir="x", max_steps=50, warmup_steps=7, schedule="wsd"), total=50)
    for step in range(50):
        assert mine(step) == pytest.approx(opt.param_groups[0]["lr"]), step
        opt.step()
        ref.step()
    with pytest.raises(BertforgeError, match="TrainConfig.schedule"):
        TrainConfig(out_dir="x", max_steps=5, schedule="step")


def test_modern_rows_are_packed_and_30_percent_masked(corpus, tmp_path):
    from bertforge.data import ShardedCorpus, prepare_corpus
    from bertforge.pretraining.inputs import make_dataset
    from bertforge.tokenization import Tokenizer
    tok = Tokenizer.train([corpus.read_text()], kind="bpe", vocab_size=200)
    prepare_corpus([str(corpus)], tok, tmp_path / "shards", progress=False, heldout_fraction=0.0)
    shards = ShardedCorpus(tmp_path / "shards", split="all")
    ds = make_dataset(shards, RECIPES["modern"], seq_len=32, seed=0)
    batch = ds.collator()([ds[i] for i in range(len(ds) - 1)])  # every row but the corpus's last
    assert batch["attention_mask"].all() and batch["input_ids"].shape[1] == 32  # no padding anywhere
    special = torch.isin(batch["input_ids"], torch.tensor(sorted(shards.special_ids)))
    labelled = batch["mlm_labels"].ne(-100)
    for row in range(len(batch["input_ids"])):
        real = int((~special[row]).sum()) + int((labelled[row] & special[row]).sum())  # masked ones read [MASK]
        assert int(labelled[row].sum()) == max(1, round(0.3 * real))


def test_modern_run_learns_and_loads_in_transformers(corpus, tmp_path):
    from transformers import ModernBertForMaskedLM

    from bertforge.model.heads import MaskedLM
    out = tmp_path / "run"
    assert run("pretrain", "--recipe", "modern", "--corpus", str(corpus), "--out", str(out), "--max-steps", "60",
               "--log-every", "5", *TINY) == 0
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r.get("split") != "eval"]
    assert train[-1]["loss"] < train[0]["loss"] - 1.0, [r["loss"] for r in train]
    peak = 2 * SIZES["tiny"].pretrain_lr  # warm-up 6% of 60 = 3 steps, stable to step 48, 1-sqrt decay to 60
    assert [r["lr"] for r in train[1:9]] == pytest.approx([peak] * 8)
    assert train[-1]["lr"] < 0.35 * peak
    res = json.loads((out / "eval_results.json").read_text())
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    assert res["recipe"]["mask_prob"] == 0.3 and res["heldout"]["mlm_loss"] < 0.7 * torch.tensor(vocab).log()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["ModernBertForMaskedLM"] and cfg["cls_token_id"] is not None
    ref, info = ModernBertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    from bertforge.commands.model import describe
    assert describe(out)["blocks"].startswith("pre-norm, rotary positions, GeGLU MLP, window 128")  # bertforge info
    ours = MaskedLM.from_pretrained(out)  # the saved model as bertforge reloads it
    ids = torch.tensor([[0, 5, 6, 7, 4, 9, 10, 2]])  # a <mask>-free row of in-vocabulary ids
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), ref.eval()(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_modern_checkpoint_fine_tunes_and_reloads(corpus, tmp_path):
    from bertforge.model.heads import MaskedLM
    from bertforge.config import compose
    from bertforge.tasks.models import init_from_pretrained, load_task_model, save_task_model
    src = tmp_path / "mlm"
    MaskedLM(compose("modernbert", "tiny", vocab_size=60, pad_token_id=0)).save_pretrained(src)
    model, missing = init_from_pretrained(src, "classify", num_labels=2)
    assert all(not m.startswith("bert.") for m in missing) and model.architecture == "BertforgeSequenceClassifier"
    save_task_model(model, tmp_path / "ft", ["neg", "pos"], {"task": "sst2"})
    again, task, labels = load_task_model(tmp_path / "ft")
    batch = {"input_ids": torch.tensor([[1, 5, 6, 2, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 1, 0]])}
    with torch.no_grad():
        torch.testing.assert_close(again(**batch)["logits"], model.eval()(**batch)["logits"])
    assert labels == ["neg", "pos"] and task["kind"] == "classify"


def test_modernbert_takes_pair_inputs_as_one_segment():
    from bertforge.pretraining.inputs import check_model_fits_recipe, single_segment
    recipe = resolve("modern", input_format="segment-pair")
    cfg = recipe.model_config("bert-tiny", vocab_size=100, pad_token_id=0, seq_len=64)
    check_model_fits_recipe(cfg, recipe, "--recipe modern")  # no token types, and none needed
    assert single_segment(cfg, recipe)
    with pytest.raises(BertforgeError, match="has no pooler for the sentence head"):
        resolve("modern", objective="mlm+nsp", input_format="segment-pair")
