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
from bertforge.model.checkpoint import read_tensors
from bertforge.pretraining.recipes import ICT, REALM, RECIPES

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

    from bertforge.pretraining.objectives import MLMObjective
    from bertforge.tokenization import Tokenizer
    out = tmp_path / "run"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "25", "--lr", "3e-3",
               *TINY) == 0
    res = json.loads((out / "eval_results.json").read_text())
    assert res["steps"] == 25 and 0.0 <= res["heldout"]["mlm_acc"] <= 1.0 and "nsp_acc" in res["heldout"]
    hist = losses(out)
    assert hist[25] < hist[10]  # it learned something
    assert res["fill_mask"] and all(len(f["predictions"]) == 5 and f["answer"] for f in res["fill_mask"])

    hf, info = BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"]
    tok = Tokenizer.from_pretrained(out)
    ours = MLMObjective.__new__(MLMObjective)
    from bertforge.config import ModelConfig
    from bertforge.model.checkpoint import load_pretrained
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


STEPS, SAVE = 6, 3  # a checkpoint at step 3; the straight run goes on to step 6, the interrupted one resumes there


# ICT and REALM write a retriever's folders, not one MLM model (pretraining/ict.py, pretraining/realm.py): REALM's exact
# resume is tests/test_retrieval_realm_pretrain.py's, the shared retriever trainer's tests/test_retrieval_dpr.py's
@pytest.mark.parametrize("recipe", sorted(r for r, rec in RECIPES.items() if rec.objective not in (ICT, REALM)))
def test_resume_matches_an_uninterrupted_run(corpus, tmp_path, recipe):
    """Every recipe, killed after its checkpoint and resumed, ends with the uninterrupted run's losses and weights
    (DeBERTa-v3's gradient-disentangled embeddings included)."""
    common = ["pretrain", "--corpus", str(corpus), "--max-steps", str(STEPS), "--save-every", str(SAVE),
              "--log-every", "1", "--recipe", recipe, *TINY]
    straight = tmp_path / "straight"
    assert run(*common, "--out", str(straight)) == 0
    # The interrupted run: everything the straight run had written after step SAVE never happened.
    interrupted = tmp_path / "interrupted"
    shutil.copytree(straight, interrupted)
    shutil.rmtree(interrupted / "checkpoints" / f"step-{STEPS}")
    (interrupted / "checkpoints" / "latest").write_text(f"step-{SAVE}\n")
    for f in ("model.safetensors", "eval_results.json"):
        (interrupted / f).unlink()
    assert run(*common, "--out", str(interrupted), "--resume") == 0
    a, b = losses(straight), losses(interrupted)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    assert all(a[s] == b[s] for s in range(SAVE + 1, STEPS + 1)), (a, b)  # bit-exact: same machine, same threads
    mine, theirs = (read_tensors(d / "model.safetensors") for d in (straight, interrupted))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    # eval_results counts both segments, not the last one only
    whole, parts = (json.loads((d / "eval_results.json").read_text()) for d in (straight, interrupted))
    assert whole["heldout"] == parts["heldout"]
    assert (whole["segments"], parts["segments"]) == (1, 2)
    assert parts["tokens_seen"] == whole["tokens_seen"] > 0
    assert parts["seconds"]["train"] > json.loads(
        (interrupted / "speed.jsonl").read_text().splitlines()[SAVE - 1])["elapsed_s"]  # the first segment


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
    with pytest.raises(BertforgeError, match="init.from"):  # the verb's function names the parameter; cli.main the flag
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
    # real non-padding tokens over both ranks: at most the padded size, and most of it
    assert res["steps"] == 4 and 0.5 * 4 * 8 * 32 * 2 < res["tokens_seen"] <= 4 * 8 * 32 * 2
    assert (out / "model.safetensors").is_file()


def test_prepare_then_pretrain_from_shards(corpus, tmp_path):
    from bertforge.tokenization import Tokenizer
    tok = Tokenizer.train(corpus.read_text().splitlines(), kind="wordpiece", vocab_size=200)
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


def test_roberta_with_pair_inputs_uses_one_segment_id(corpus, tmp_path):
    """RoBERTa has type_vocab_size 1: pair builders' segment id 1 would index past the embedding table."""
    out = tmp_path / "rp"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "2", "--recipe", "roberta",
               "--input-format", "segment-pair", *TINY) == 0
    assert json.loads((out / "config.json").read_text())["type_vocab_size"] == 1


def test_init_from_a_model_that_cannot_take_the_recipe_is_one_clear_error(corpus, tmp_path):
    first = tmp_path / "mlm-only"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(first), "--max-steps", "1", "--recipe", "roberta",
               *TINY) == 0
    with pytest.raises(BertforgeError, match="without a pooler cannot train NSP"):
        run("pretrain", "--corpus", str(corpus), "--out", str(tmp_path / "z"), "--max-steps", "1",
            "--objective", "mlm+nsp", "--input-format", "segment-pair", "--init-from", str(first), *TINY)


def test_pair_inputs_need_two_token_types_unless_roberta():
    from bertforge.config import ModelConfig
    from bertforge.pretraining.recipes import resolve
    from bertforge.pretraining.inputs import check_model_fits_recipe, single_segment
    recipe = resolve("bert", objective="mlm")  # segment pairs
    bert = ModelConfig(model_type="bert", vocab_size=100, hidden_size=8, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=16, type_vocab_size=1)
    with pytest.raises(BertforgeError, match="type_vocab_size 1"):
        check_model_fits_recipe(bert, recipe, "--init-from x")
    roberta = bert.replace(model_type="roberta")
    check_model_fits_recipe(roberta, recipe, "--init-from x")
    assert single_segment(roberta, recipe) and not single_segment(bert.replace(type_vocab_size=2), recipe)


def test_heldout_fraction_comes_from_the_manifest_of_given_shards(corpus, tmp_path):
    from bertforge.pretraining.options import PretrainOptions
    from bertforge.pretraining.recipes import resolve
    from bertforge.tokenization import Tokenizer
    assert PretrainOptions(recipe=resolve("bert"), out=tmp_path).heldout_fraction is None
    tok = Tokenizer.train(corpus.read_text().splitlines(), kind="wordpiece", vocab_size=200)
    tok.save_pretrained(tmp_path / "tok")
    assert run("prepare", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "tok"), "--out",
               str(tmp_path / "shards"), "--heldout-fraction", "0") == 0
    args = [a for a in TINY if a not in ("--vocab-size", "200", "--heldout-fraction", "0.1")]
    # the manifest's 0 held-out share is honoured (a default of 0.05 would have overridden it)
    with pytest.raises(BertforgeError, match="no held-out documents at heldout_fraction=0"):
        run("pretrain", "--data", str(tmp_path / "shards"), "--tokenizer", str(tmp_path / "tok"),
            "--out", str(tmp_path / "run"), "--max-steps", "1", *args)


def test_fresh_run_does_not_reuse_tokenizer_or_shards_of_another_corpus(corpus, tmp_path):
    import os
    from bertforge.pretraining.recipes import resolve
    from bertforge.pretraining.options import PretrainOptions
    from bertforge.pretraining.prepare import prepare_data, prepare_tokenizer
    text = tmp_path / "c.txt"
    text.write_text(corpus.read_text())
    opts = PretrainOptions(recipe=resolve("bert"), out=tmp_path / "out", corpus=[str(text)], vocab_size=200,
                           progress=False)
    tok = prepare_tokenizer(opts, [str(text)], is_main=True)
    opts.vocab_size = tok.vocab_size  # the tiny corpus has fewer than 200 pieces: ask for what it has
    tok_json = tmp_path / "out" / "tokenizer" / "tokenizer.json"
    first = json.loads((prepare_data(opts, [str(text)], tok, True) / "manifest.json").read_text())
    # same files, same kind and size: reused (not retrained)
    before = tok_json.stat().st_mtime_ns
    prepare_tokenizer(opts, [str(text)], is_main=True)
    assert tok_json.stat().st_mtime_ns == before
    # same path, new contents: a new tokenizer and new shards
    text.write_text("zebra quagga okapi narwhal.\n\n" * 200 + corpus.read_text())
    os.utime(text, ns=(1, 1))
    tok2 = prepare_tokenizer(opts, [str(text)], is_main=True)
    assert '"zebra"' in tok_json.read_text()
    second = json.loads((prepare_data(opts, [str(text)], tok2, True) / "manifest.json").read_text())
    assert second["num_documents"] > first["num_documents"]


# ---- the installed console script: what it prints is true ---------------------------------------------------------
BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")


def test_console_script_roberta_run_shows_text_and_whole_word_prompts_and_real_curves(corpus, tmp_path):
    assert BERTFORGE, "the bertforge console script is not installed"
    out = tmp_path / "rob"
    args = [a if a != "200" else "400" for a in TINY]  # BPE: 256 bytes + merges enough for whole words
    proc = subprocess.run([BERTFORGE, "pretrain", "--recipe", "roberta", "--corpus", str(corpus), "--out", str(out),
                           "--max-steps", "5", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "eval_results.json").read_text())
    assert res["fill_mask"]
    vocab = set(WORDS)
    for f in res["fill_mask"]:
        # one whole word masked: put the answer back and every word is a corpus word again
        assert f["text"].count("<mask>") == 1 and f["answer"].lower() in vocab
        words = f["text"].replace("<mask>", f["answer"]).rstrip(".").lower().replace(".", "").split()
        assert set(words) <= vocab, f["text"]
        assert all("Ġ" not in p["token"] and p["token"] == p["token"].strip() for p in f["predictions"])
    import importlib.util
    assert importlib.util.find_spec("matplotlib")  # the [test] extra installs it: this is the written branch
    assert (out / "curves.png").stat().st_size > 1000
    assert f"training curves: {out / 'curves.png'}" in proc.stdout and "not written" not in proc.stdout


def test_without_matplotlib_no_curves_are_claimed(corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "noplot"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "2", *TINY) == 0
    (out / "curves.png").write_bytes(b"an earlier segment's plot")
    os.utime(out / "curves.png", (1, 1))
    capsys.readouterr()
    # `import matplotlib...` now raises ImportError (also for submodules an earlier test already imported)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    assert run("pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "4", "--resume", *TINY) == 0
    printed = capsys.readouterr().out
    assert "curves.png not written: pip install 'bertforge[plot]'" in printed
    assert "training curves:" not in printed and "curves.png)" not in printed
    assert (out / "curves.png").read_bytes() == b"an earlier segment's plot"


def test_a_run_at_the_baseline_warns_once_with_the_likely_cause(corpus, tmp_path, monkeypatch, capsys):
    from functools import partial

    from bertforge.pretraining import metrics
    from bertforge.pretraining import run as run_module
    # a learning rate too small to move the weights: held-out accuracy stays at or below the baseline; the
    # detector's step threshold is lowered so a 4-step test run counts
    monkeypatch.setattr(run_module, "stuck_at_baseline", partial(metrics.stuck_at_baseline, after_steps=2))
    out = tmp_path / "stuck"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "4", "--lr", "1e-9",
               "--log-every", "2", *TINY) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "most frequent token" in warnings[0] and "too few steps" in warnings[0]
    res = json.loads((out / "eval_results.json").read_text())
    assert res["stuck_at_baseline_step"] == 4 and res["heldout"]["mlm_acc"] < res["heldout"]["baseline_acc"] + 0.01


def test_named_heldout_corpora_are_scored_at_the_end(corpus, tmp_path):
    """--heldout NAME=FILE: each file is masked once like the held-out split and scored on the final model (one
    number per language in a multilingual run); the same text as the training corpus scores like it."""
    words = corpus.read_text().split()
    other = tmp_path / "shuffled.txt"
    shuffled = random.Random(1).sample(words, len(words))
    other.write_text("\n\n".join(" ".join(shuffled[i:i + 50]) for i in range(0, len(shuffled), 50)) + "\n")
    out = tmp_path / "run"
    assert run("pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "3", "--heldout",
               f"same={corpus}", f"shuffled={other}", *TINY) == 0
    sets = json.loads((out / "eval_results.json").read_text())["heldout_sets"]
    assert set(sets) == {"same", "shuffled"}
    for s in sets.values():
        assert s["masked_tokens"] > 0 and 0.0 <= s["mlm_acc"] <= 1.0 and s["baseline_acc"] > 0
    assert (out / "heldout" / "same" / "manifest.json").is_file()
    with pytest.raises(BertforgeError, match="--heldout same=x: give NAME=PATH with a name of its own"):
        run("pretrain", "--corpus", str(corpus), "--out", str(tmp_path / "r2"), "--max-steps", "1", "--heldout",
            f"same={corpus}", "same=x", *TINY)
    with pytest.raises(BertforgeError, match="--heldout scores masked tokens"):
        run("pretrain", "--recipe", "gpt", "--corpus", str(corpus), "--out", str(tmp_path / "r3"), "--max-steps",
            "1", "--heldout", f"x={corpus}", *TINY)
