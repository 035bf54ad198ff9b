"""`bertforge pretrain` end to end on a tiny corpus: HF-loadable checkpoint with the same fill-mask, exact resume,
recipes/flags, a two-process gloo run."""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bertforge.commands import pretrain as cmd
from bertforge.errors import BertforgeError

WORDS = ("the cat dog bird fish sat ran flew swam on under near over a mat tree river house garden quickly slowly "
         "red green blue small big old young happy sad and but then because").split()
TINY = ["--size", "bert-tiny", "--seq-len", "32", "--batch-size", "8", "--vocab-size", "200", "--no-progress",
        "--heldout-fraction", "0.1", "--eval-batches", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """~150 documents of 4-7 short sentences from a small grammar (deterministic)."""
    rng = random.Random(0)
    docs = []
    for _ in range(150):
        sents = []
        for _ in range(rng.randint(4, 7)):
            n = rng.randint(5, 10)
            sents.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
        docs.append(" ".join(sents))
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="bertforge")
    cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def losses(out: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in recs if r.get("split") != "eval" and "loss" in r}


def test_pretrain_end_to_end_loads_in_transformers_with_same_fill_mask(corpus, tmp_path):
    from transformers import BertForPreTraining

    from bertforge.pretrain.objectives import MLMObjective
    from bertforge.tokenization import Tokenizer
    out = tmp_path / "run"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "25", "--lr", "3e-3",
               *TINY) == 0
    res = json.loads((out / "eval_results.json").read_text())
    assert res["steps"] == 25 and 0.0 <= res["heldout"]["mlm_acc"] <= 1.0 and "nsp_acc" in res["heldout"]
    hist = losses(out)
    assert hist[25] < hist[10]  # it learned something

    hf, info = BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"]
    tok = Tokenizer.from_pretrained(out)
    ours = MLMObjective.__new__(MLMObjective)
    from bertforge.config import ModelConfig
    from bertforge.checkpoint import load_pretrained
    ours = MLMObjective(ModelConfig.from_file(out), relation="nsp")
    load_pretrained(ours, out)
    texts = [f"the cat sat on the {tok.mask_token} .", f"a small {tok.mask_token} ran under the old tree ."]
    enc = tok(texts, return_tensors="pt")
    pos = enc["input_ids"].eq(tok.mask_token_id)
    with torch.no_grad():
        mine = ours.eval().predict_masked(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"], pos)
        theirs = hf.eval()(**enc).prediction_logits[pos]
    assert mine.argmax(-1).tolist() == theirs.argmax(-1).tolist()
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def test_resume_matches_an_uninterrupted_run(corpus, tmp_path):
    common = ["pretrain", "--corpus", str(corpus), "--max-steps", "40", "--save-every", "20", "--log-every", "1",
              "--recipe", "roberta", *TINY]
    straight = tmp_path / "straight"
    assert run(*common, "--out", str(straight)) == 0
    # The interrupted run: everything the straight run had written after step 20 never happened.
    interrupted = tmp_path / "interrupted"
    shutil.copytree(straight, interrupted)
    shutil.rmtree(interrupted / "checkpoints" / "step-40")
    (interrupted / "checkpoints" / "latest").write_text("step-20\n")
    for f in ("model.safetensors", "eval_results.json"):
        (interrupted / f).unlink()
    assert run(*common, "--out", str(interrupted), "--resume") == 0
    a, b = losses(straight), losses(interrupted)
    assert sorted(a) == sorted(b) == list(range(1, 41))
    assert all(a[s] == pytest.approx(b[s], rel=1e-6, abs=1e-7) for s in range(21, 41)), (a, b)


@pytest.mark.parametrize("flags,expect", [
    (["--recipe", "albert"], {"model_type": "albert", "objective": "mlm+sop", "tok": "unigram"}),
    (["--recipe", "spanbert"], {"model_type": "bert", "objective": "span+sbo", "tok": "wordpiece"}),
    (["--recipe", "electra"], {"model_type": "electra", "objective": "electra", "tok": "wordpiece"}),
    (["--recipe", "bert", "--objective", "mlm", "--masking", "whole_word", "--dynamic",
      "--input-format", "doc-sentences"], {"model_type": "bert", "objective": "mlm", "tok": "wordpiece"}),
])
def test_recipes_and_flags_run(corpus, tmp_path, flags, expect):
    out = tmp_path / "r"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "3", *flags, *TINY) == 0
    res = json.loads((out / "eval_results.json").read_text())
    assert res["recipe"]["objective"] == expect["objective"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == expect["model_type"]
    tok_cfg = json.loads((out / "tokenizer.json").read_text())
    assert tok_cfg["model"]["type"].lower() == expect["tok"]
    if expect["objective"] == "electra":
        assert (out / "discriminator" / "config.json").is_file() and (out / "generator" / "config.json").is_file()
        assert "rtd_acc" in res["heldout"]


def test_clear_errors(corpus, tmp_path):
    with pytest.raises(BertforgeError, match="needs sentence pairs"):
        run("pretrain", "--corpus", str(corpus), "--objective", "mlm+nsp", "--input-format", "full-sentences",
            "--out", str(tmp_path / "x"), "--max-steps", "1", *TINY)
    with pytest.raises(BertforgeError, match="init-from"):
        run("pretrain", "--corpus", str(corpus), "--init-from", str(tmp_path / "nope"),
            "--out", str(tmp_path / "y"), "--max-steps", "1", *TINY)


def test_init_from_continues_pretraining_with_its_tokenizer(corpus, tmp_path):
    first = tmp_path / "first"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(first), "--max-steps", "5", "--recipe", "roberta",
               *TINY) == 0
    second = tmp_path / "second"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(second), "--max-steps", "3", "--recipe", "roberta",
               "--init-from", str(first), *TINY) == 0
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()
    assert not (second / "tokenizer").exists()  # no new tokenizer was trained


def test_two_process_gloo_run(corpus, tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(textwrap.dedent("""
        import argparse, sys
        from bertforge.commands import pretrain as cmd
        p = argparse.ArgumentParser(); cmd.register(p.add_subparsers(dest="command"))
        a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))
    """))
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(29500 + os.getpid() % 1000), str(script), "pretrain", "--corpus",
                           str(corpus), "--out", str(out), "--max-steps", "4", "--recipe", "roberta", *TINY],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "eval_results.json").read_text())
    assert res["steps"] == 4 and res["tokens_seen"] == 4 * 8 * 32 * 2
    assert (out / "model.safetensors").is_file()


def test_prepare_then_pretrain_from_shards(corpus, tmp_path):
    from bertforge.tokenization import Tokenizer
    tok = Tokenizer.train([corpus], kind="wordpiece", vocab_size=200)
    tok.save_pretrained(tmp_path / "tok")
    assert run("prepare", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "tok"), "--out",
               str(tmp_path / "shards"), "--heldout-fraction", "0.1") == 0
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["num_documents"] == 150
    out = tmp_path / "run"
    args = [a for a in TINY if a not in ("--vocab-size", "200")]
    assert run("pretrain", "--data", str(tmp_path / "shards"), "--tokenizer", str(tmp_path / "tok"),
               "--out", str(out), "--max-steps", "2", *args) == 0
    assert not (out / "data").exists()  # the given shards were used
    assert (out / "vocab.txt").read_text() == (tmp_path / "tok" / "vocab.txt").read_text()
