"""`bertforge longify`: a Longformer made from a RoBERTa or BERT checkpoint loads in transformers'
LongformerForMaskedLM unchanged, copies the position table over and over, starts its global Q/K/V from the local
ones, equals its source where the window covers the whole input; then `bertforge pretrain --init-from` continues
MLM on sequences longer than the source ever saw."""
from __future__ import annotations

import argparse
import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers
from safetensors.torch import load_file

from bertforge.commands import longify as longify_cmd
from bertforge.commands import pretrain as pretrain_cmd
from bertforge.errors import BertforgeError
from bertforge.pretraining.longify import tiled_positions
from bertforge.tokenization import Tokenizer

transformers.logging.set_verbosity_error()

WORDS = "the cat dog bird sat ran on under near a mat tree river house red green blue small big old and but".split()


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="bertforge")
    sub = parser.add_subparsers(dest="command")
    longify_cmd.register(sub)
    pretrain_cmd.register(sub)
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = random.Random(0)
    docs = [" ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))).capitalize() + "."
                     for _ in range(rng.randint(8, 14))) for _ in range(80)]
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path, docs


def _source(tmp_path, docs, family: str):
    """A tiny transformers RoBERTa / BERT MLM with 32 positions and bertforge's tokenizer, saved in tmp_path."""
    tok = Tokenizer.train(docs, kind="bpe" if family == "roberta" else "wordpiece", vocab_size=300,
                          model_max_length=32)
    shape = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    if family == "roberta":
        model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
            **shape, max_position_embeddings=34, pad_token_id=tok.pad_token_id, type_vocab_size=1))
    else:
        model = transformers.BertForMaskedLM(transformers.BertConfig(**shape, max_position_embeddings=32,
                                                                     pad_token_id=tok.pad_token_id))
    path = tmp_path / family
    model.eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path, model, tok


@pytest.mark.parametrize("family", ["roberta", "bert"])
def test_longify_loads_in_transformers_and_equals_its_source(corpus, tmp_path, family, capsys):
    src, short, tok = _source(tmp_path, corpus[1], family)
    out = tmp_path / "long"
    assert run("longify", "--model", str(src), "--max-length", "100", "--out", str(out),
               "--attention-window", "16") == 0
    assert "LongformerForMaskedLM" in capsys.readouterr().out
    long, info = transformers.LongformerForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert long.config.attention_window == [16, 16] and json.loads((out / "tokenizer_config.json").read_text()
                                                                   )["model_max_length"] == 100
    offset = tok.pad_token_id + 1
    assert long.config.max_position_embeddings == offset + 100
    # positions copied over and over: row offset + 32 + i starts as row offset + i (the source's row i)
    table = long.longformer.embeddings.position_embeddings.weight
    old = short.base_model.embeddings.position_embeddings.weight
    old_offset = offset if family == "roberta" else 0
    torch.testing.assert_close(table[offset + 32: offset + 64], old[old_offset: old_offset + 32])
    torch.testing.assert_close(table[offset + 96: offset + 100], old[old_offset: old_offset + 4])
    state = load_file(str(out / "model.safetensors"))
    for name in ("query", "key", "value"):  # global projections start as the local ones
        torch.testing.assert_close(state[f"longformer.encoder.layer.1.attention.self.{name}_global.weight"],
                                   state[f"longformer.encoder.layer.1.attention.self.{name}.weight"])
    # within the window (8 tokens either side) and without global tokens, Longformer is its source
    ids = torch.as_tensor(tok(["the cat sat on a mat under the big tree"])["input_ids"])[:, :9]
    with torch.no_grad():
        torch.testing.assert_close(long.eval()(ids).logits, short(ids).logits, atol=1e-5, rtol=0)


def test_continued_pretraining_on_long_sequences(corpus, tmp_path):
    path, docs = corpus
    src, _, _ = _source(tmp_path, docs, "roberta")
    long = tmp_path / "long"
    assert run("longify", "--model", str(src), "--max-length", "96", "--out", str(long),
               "--attention-window", "16") == 0
    out = tmp_path / "run"
    assert run("pretrain", "--init-from", str(long), "--recipe", "roberta", "--corpus", str(path), "--out", str(out),
               "--seq-len", "96", "--batch-size", "4", "--max-steps", "3", "--no-progress", "--threads", "1",
               "--heldout-fraction", "0.1", "--eval-batches", "1") == 0
    res = json.loads((out / "eval_results.json").read_text())
    assert res["steps"] == 3 and 0.0 <= res["heldout"]["mlm_acc"] <= 1.0
    hf, info = transformers.LongformerForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and hf.config.max_position_embeddings == 98
    trained = load_file(str(out / "model.safetensors"))
    before = load_file(str(long / "model.safetensors"))
    key = "longformer.embeddings.position_embeddings.weight"
    assert not torch.equal(trained[key][40:90], before[key][40:90])  # positions beyond the source's 32 trained


def test_tiled_positions_and_bad_input(corpus, tmp_path):
    old = torch.arange(12.0).view(6, 2)  # offset 2: rows 2..5 are the 4 learned positions
    new = tiled_positions(old, 2, 2, 10)
    assert new.shape == (12, 2) and torch.equal(new[:2], old[:2]) and torch.equal(new[6:10], old[2:6])
    assert torch.equal(tiled_positions(old, 0, 1, 7)[1:], torch.cat([old, old[:1]]))
    src, _, _ = _source(tmp_path, corpus[1], "bert")
    with pytest.raises(BertforgeError, match="--max-length 1 must be at least 2"):
        run("longify", "--model", str(src), "--max-length", "1", "--out", str(tmp_path / "a"))
    with pytest.raises(BertforgeError, match="attention_window 15 must be a positive even"):
        run("longify", "--model", str(src), "--max-length", "64", "--out", str(tmp_path / "b"),
            "--attention-window", "15")
    albert = tmp_path / "albert"
    transformers.AlbertModel(transformers.AlbertConfig(vocab_size=50, hidden_size=32, num_attention_heads=4,
                                                       intermediate_size=37, embedding_size=16,
                                                       num_hidden_layers=1)).save_pretrained(albert)
    with pytest.raises(BertforgeError, match="a albert checkpoint cannot be longified"):
        run("longify", "--model", str(albert), "--max-length", "64", "--out", str(tmp_path / "c"))


def test_finetune_a_longified_model_on_classification(corpus, tmp_path):
    """`bertforge finetune` on a Longformer: [CLS] is global, RoBERTa's head, and the result loads in
    transformers' LongformerForSequenceClassification with the same logits."""
    from bertforge.commands import finetune as finetune_cmd
    from bertforge.tasks.models import load_task_model

    src, _, tok = _source(tmp_path, corpus[1], "bert")
    long = tmp_path / "long"
    assert run("longify", "--model", str(src), "--max-length", "64", "--out", str(long),
               "--attention-window", "8") == 0
    data = tmp_path / "sst"
    data.mkdir()
    rng = random.Random(0)
    for name, n in (("train", 32), ("dev", 16)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            y = rng.randint(0, 1)
            words = [rng.choice(WORDS) for _ in range(12)] + [("big" if y else "small")]
            rows.append(" ".join(words) + f"\t{y}")
        (data / f"{name}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    parser = argparse.ArgumentParser(prog="bertforge")
    finetune_cmd.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "clf"
    args = parser.parse_args(["finetune", "--task", "sst2", "--data", str(data), "--model", str(long), "--out",
                              str(out), "--epochs", "1", "--batch-size", "8", "--no-progress"])
    assert args.func(args) == 0
    model, _, _ = load_task_model(out)
    hf, info = transformers.LongformerForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    enc = tok(["the cat sat on a big mat near the old river and the red house"])
    ids, mask = torch.as_tensor(enc["input_ids"]), torch.as_tensor(enc["attention_mask"])
    with torch.no_grad():  # transformers sets global attention on [CLS] itself, as bertforge does
        torch.testing.assert_close(model(ids, mask)["logits"], hf.eval()(ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=0)
