"""Head mask and head pruning: a mask of ones changes nothing, a zeroed head equals that head's values zeroed and
the head removed physically (eager and SDPA alike), a pruned checkpoint reloads smaller, and `bertforge prune`."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertforge.analysis.importance import head_importance, iterative_mask, prune_masked
from bertforge.model.checkpoint import save_pretrained
from bertforge.config import ModelConfig, preset
from bertforge.errors import BertforgeError
from bertforge.model import Encoder, for_inference
from bertforge.tasks.kinds import Encoded
from bertforge.tasks.models import init_from_pretrained, load_task_model, save_task_model
from bertforge.tokenization import Tokenizer

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")


def tiny(impl: str = "sdpa", seed: int = 0) -> Encoder:
    cfg = preset("bert-tiny", vocab_size=50, num_hidden_layers=3, num_attention_heads=4, hidden_size=32,
                 intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(seed)
    return Encoder(cfg, impl).eval()


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padding, so the masked-key path runs too
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_head_mask_of_ones_changes_nothing(impl):
    model, x = tiny(impl), inputs()
    with torch.no_grad():
        ref = model(**x).last_hidden_state
        out = model(**x, head_mask=torch.ones(3, 4)).last_hidden_state
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_zeroed_head_equals_its_values_zeroed_and_its_removal(impl):
    model, x = tiny(impl), inputs()
    mask = torch.ones(3, 4)
    mask[0, 1] = mask[2, 0] = mask[2, 3] = 0.0
    with torch.no_grad():
        masked = model(**x, head_mask=mask).last_hidden_state
        # reference 1: a head whose value rows are zero contributes P @ 0 = 0, which is what masking it means
        ref = tiny(impl)
        d = ref.config.head_dim
        for layer, head in ((0, 1), (2, 0), (2, 3)):
            v = ref.encoder.layer[layer].attention.self.value
            v.weight[head * d:(head + 1) * d] = 0
            v.bias[head * d:(head + 1) * d] = 0
        torch.testing.assert_close(masked, ref(**x).last_hidden_state, atol=1e-6, rtol=1e-5)
        # reference 2: the heads removed physically
        pruned = tiny(impl)
        n_before = pruned.num_parameters()
        pruned.prune_heads({0: [1], 2: [0, 3]})
        torch.testing.assert_close(pruned(**x).last_hidden_state, masked, atol=1e-5, rtol=1e-5)
    assert pruned.num_parameters() < n_before
    assert pruned.config.heads_per_layer == [3, 4, 2]
    assert pruned.encoder.layer[2].attention.self.query.weight.shape == (2 * d, 32)


def test_fractional_mask_is_the_same_on_sdpa_and_eager():
    x, mask = inputs(), torch.rand(3, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = tiny("sdpa")(**x, head_mask=mask).last_hidden_state
        b = tiny("eager")(**x, head_mask=mask).last_hidden_state
        c = tiny("sdpa")(**x, head_mask=mask, output_attentions=True)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c.attentions[1].sum(-1), mask[1].view(1, 4, 1).expand(3, 4, 9), atol=1e-5, rtol=0)


def test_pruned_checkpoint_reloads_smaller_and_fast_copy_works(tmp_path):
    model, x = tiny(), inputs()
    model.prune_heads({1: [0, 2]})
    model.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["bertforge"]["heads_per_layer"] == [4, 2, 4]
    back = Encoder.from_pretrained(tmp_path)
    with torch.no_grad():
        ref = model(**x).last_hidden_state
        torch.testing.assert_close(back(**x).last_hidden_state, ref, atol=0, rtol=0)
        torch.testing.assert_close(for_inference(back)(**x).last_hidden_state, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(BertforgeError, match="heads_per_layer"):
        ModelConfig(num_hidden_layers=2, heads_per_layer=[12])
    with pytest.raises(BertforgeError, match="every head"):
        model.prune_heads({0: [0, 1, 2, 3]})


# ---- importance and pruning on a task model --------------------------------------------------------------------------
WORDS = "good great bad awful the movie was very a plot".split()


def write_sst(path: Path, n: int, seed: int) -> Path:
    rng, lines = random.Random(seed), ["sentence\tlabel"]
    for _ in range(n):
        y = rng.randint(0, 1)
        lines.append(" ".join(rng.choices(WORDS[4:], k=4) + [rng.choice(WORDS[:2] if y else WORDS[2:4])]) + f"\t{y}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def task_model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("prune")
    (d / "corpus.txt").write_text("\n".join(" ".join(random.Random(i).choices(WORDS, k=8)) for i in range(200)))
    tok = Tokenizer.train((d / "corpus.txt").read_text().splitlines(), vocab_size=80, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2, num_attention_heads=4)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), d / "base", cfg, tokenizer=tok)
    model, _ = init_from_pretrained(d / "base", "classify", 2)
    save_task_model(model, d / "model", ["0", "1"], {"name": "sst2", "max_seq_len": 32}, tokenizer=tok)
    write_sst(d / "dev.tsv", 48, 1)
    return d


def test_importance_is_the_mask_gradient_and_pruning_matches_the_mask(task_model):
    from bertforge.analysis.importance import load_task_data

    model, kind, enc, _, _ = load_task_data(task_model / "model", "sst2", task_model / "dev.tsv")
    raw = head_importance(model, enc, batch_size=48, normalize=False, progress=False)
    # by hand: one batch holds every example, so the score is |d loss / d mask| of that one loss
    from bertforge.tasks.batching import TRAIN_KEYS, make_collate
    batch = make_collate(enc.pad_id)([{k: v for k, v in r.items() if k in TRAIN_KEYS} for r in enc.rows])
    m = torch.ones(2, 4, requires_grad=True)
    model.bert.head_mask = m
    (g,) = torch.autograd.grad(model(**batch)["loss"], [m])
    model.bert.head_mask = None
    assert raw == pytest.approx(g.abs().numpy(), rel=1e-4, abs=1e-9)
    mask = iterative_mask(model, enc, 0.5, step=0.25, batch_size=48, progress=False)
    assert mask.sum() == 4 and (mask.sum(1) >= 1).all()
    x = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        model.bert.head_mask = torch.tensor(mask, dtype=torch.float32)
        masked = model(**x)["logits"]
        model.bert.head_mask = None
        n_before = sum(p.numel() for p in model.parameters())
        prune_masked(model, mask)
        torch.testing.assert_close(model(**x)["logits"], masked, atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in model.parameters()) < n_before
    assert model.config.heads_per_layer == [int(s) for s in mask.sum(1)]


def run(*args: object) -> subprocess.CompletedProcess:
    assert BERTFORGE, "the bertforge console script is not installed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([BERTFORGE, *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def test_prune_command_writes_a_smaller_model_that_loads(task_model, tmp_path):
    out = tmp_path / "pruned"
    proc = run("prune", "--model", task_model / "model", "--task", "sst2", "--data", task_model / "dev.tsv",
               "--fraction", "0.25", "--out", out, "--finetune-steps", "2")
    assert proc.returncode == 0, proc.stderr
    assert "transformers v5 cannot load pruned heads" in proc.stdout
    report = json.loads((out / "pruning.json").read_text())
    assert report["heads_removed"] == 2 and report["parameters_after"] < report["parameters_before"]
    model, task, _ = load_task_model(out)
    assert sum(model.config.heads_per_layer) == 6 and task["name"] == "sst2"


def test_prune_refuses_a_fraction_outside_0_1(task_model, tmp_path, capsys):
    from bertforge.cli import main

    for fraction in ("1.5", "0", "1"):
        assert main(["prune", "--model", str(task_model / "model"), "--task", "sst2", "--data",
                     str(task_model / "dev.tsv"), "--fraction", fraction, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--fraction" in err[0]
    assert not (tmp_path / "x").exists()
    assert main(["prune", "--model", str(task_model / "model"), "--task", "conll", "--data",
                 str(task_model / "dev.tsv"), "--fraction", "0.5", "--out", str(tmp_path / "x")]) == 2
    assert "not --task 'conll'" in capsys.readouterr().err
