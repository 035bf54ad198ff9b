"""`bertforge pretrain --recipe gpt`: the causal-LM loss, the n-gram baselines worked by hand, and a tiny run end to
end whose checkpoint transformers loads with the same logits."""
from __future__ import annotations

import argparse
import json
import math
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertforge.commands import pretrain as cmd
from bertforge.config import compose
from bertforge.errors import BertforgeError
from bertforge.pretraining.lm_eval import DISCOUNT, NgramBaselines
from bertforge.pretraining.objectives import CausalLMObjective, next_token_loss
from bertforge.pretraining.recipes import resolve

WORDS = ("the cat dog bird fish sat ran flew swam on under near over a mat tree river house garden quickly slowly "
         "red green blue small big old young happy sad and but then because").split()


def test_next_token_loss_is_shifted_cross_entropy_over_real_tokens():
    g = torch.Generator().manual_seed(0)
    logits, ids = torch.randn(2, 5, 7, generator=g), torch.randint(0, 7, (2, 5), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    loss, acc, n = next_token_loss(logits, ids, mask)
    # by hand: row 0 predicts ids[0, 1:5] from positions 0..3, row 1 ids[1, 1:3] from positions 0..1
    pred = torch.cat([logits[0, :4], logits[1, :2]])
    gold = torch.cat([ids[0, 1:], ids[1, 1:3]])
    assert n == 6
    torch.testing.assert_close(loss, F.cross_entropy(pred, gold))
    torch.testing.assert_close(acc, (pred.argmax(-1) == gold).float().mean())


def test_objective_loss_equals_transformers_labels_loss(tmp_path):
    import transformers
    cfg = compose("gpt2", "tiny", num_hidden_layers=1, vocab_size=50, max_position_embeddings=16)
    model = CausalLMObjective(cfg).eval()
    model.save_pretrained(tmp_path)
    ref = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids)["loss"]
        theirs = ref(ids, labels=ids).loss
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_ngram_baselines_worked_by_hand():
    # stream 0 1 2 1 2 0 over V = 4 (token 3 never occurs)
    ng = NgramBaselines(np.array([0, 1, 2, 1, 2, 0]), vocab_size=4)
    # unigram, add-one: counts 2 2 2 0 over 6 tokens
    np.testing.assert_allclose(np.exp(ng.unigram_logprob(np.array([1, 3]))), [3 / 10, 1 / 10])
    # bigram pairs: (0,1) (1,2) x2 (2,1) (2,0); continuation counts N1+(.w): w0:1 w1:2 w2:1 w3:0 of 4 types
    cont = np.array([2, 3, 2, 1]) / (4 + 4)
    d = DISCOUNT
    p_2_after_1 = (2 - d) / 2 + d * 1 / 2 * cont[2]        # c(1,2)=2, c(1.)=2, one follower type
    p_0_after_2 = (1 - d) / 2 + d * 2 / 2 * cont[0]        # c(2,0)=1, c(2.)=2, two follower types
    p_3_after_2 = d * 2 / 2 * cont[3]                      # unseen pair: the back-off mass only
    p_1_after_3 = cont[1]                                  # unseen history: the continuation distribution
    got = np.exp(ng.bigram_logprob(np.array([1, 2, 2, 3]), np.array([2, 0, 3, 1])))
    np.testing.assert_allclose(got, [p_2_after_1, p_0_after_2, p_3_after_2, p_1_after_3])
    # every history's distribution sums to one
    for h in range(4):
        total = np.exp(ng.bigram_logprob(np.full(4, h), np.arange(4))).sum()
        assert math.isclose(total, 1.0, rel_tol=1e-12)
    batch = {"input_ids": torch.tensor([[1, 2, 0, 3]]), "attention_mask": torch.tensor([[1, 1, 1, 0]])}
    ppl = ng.perplexities([batch])  # targets 2 (after 1) and 0 (after 2); the padded 3 is not a target
    assert math.isclose(ppl["bigram_ppl"], (p_2_after_1 * p_0_after_2) ** -0.5)
    assert math.isclose(ppl["unigram_ppl"], (3 / 10 * 3 / 10) ** -0.5)


def test_recipe_gpt_refuses_what_does_not_fit():
    assert resolve("gpt").model_type == "gpt2" and resolve("gpt").tokenizer_kind == "gpt2"
    with pytest.raises(BertforgeError, match="the causal LM objective \\(clm\\) and the decoder"):
        resolve("gpt", objective="mlm")
    with pytest.raises(BertforgeError, match="the causal LM objective"):
        resolve("bert", objective="clm")
    with pytest.raises(BertforgeError, match="--objective clm reads single packed sequences"):
        resolve("gpt", input_format="segment-pair")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
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


def test_pretrain_gpt_end_to_end(corpus, tmp_path, capsys):
    import transformers

    from bertforge.generation import generate, load
    out = tmp_path / "gpt"
    assert run("pretrain", "--recipe", "gpt", "--corpus", str(corpus), "--out", str(out), "--size", "bert-tiny",
               "--seq-len", "32", "--batch-size", "8", "--vocab-size", "300", "--no-progress", "--heldout-fraction",
               "0.1", "--eval-batches", "2", "--threads", "1", "--max-steps", "80", "--log-every", "10") == 0
    printed = capsys.readouterr().out
    assert "objective clm, next token" in printed and "next-token perplexity" in printed and "sample:" in printed
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in recs if "loss" in r and r.get("split") != "eval"]
    assert losses[-1] < losses[0] - 1.0  # it learns
    res = json.loads((out / "eval_results.json").read_text())
    held = res["heldout"]
    assert held["lm_ppl"] < held["unigram_ppl"] and held["bigram_ppl"] < held["unigram_ppl"]
    assert len(res["samples"]) == 3 and all(s["prompt"] for s in res["samples"])
    # the saved directory is GPT-2's: transformers loads it with no missing keys and computes the same logits
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["GPT2LMHeadModel"] and cfg["n_positions"] == 32
    assert cfg["bos_token_id"] == cfg["eos_token_id"] == 0  # <|endoftext|>
    ref, info = transformers.GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    lm, tok = load(out)
    ids = torch.tensor([lm.prompt_ids(tok, "The cat sat on the")])
    with torch.no_grad():
        torch.testing.assert_close(lm(ids), ref.eval()(ids).logits, atol=1e-5, rtol=0)
    assert isinstance(generate(lm, tok, "The cat", max_new_tokens=5, seed=0), str)
    # an encoder checkpoint cannot continue as a decoder
    with pytest.raises(BertforgeError, match="a bert model cannot train --objective clm"):
        from bertforge.model import Encoder
        Encoder(compose("bert", "tiny", vocab_size=tok.vocab_size)).save_pretrained(tmp_path / "enc", tokenizer=tok)
        run("pretrain", "--recipe", "gpt", "--corpus", str(corpus), "--out", str(tmp_path / "x"),
            "--init-from", str(tmp_path / "enc"), "--max-steps", "1", "--no-progress", "--threads", "1")
