"""DeBERTa-v3's pretraining: replaced-token detection on a DeBERTa encoder (a half-depth generator of the same
width), the three embedding-sharing modes (none / shared / gradient-disentangled), the `deberta-v3` recipe and
`pretrain --family`, checkpoints that transformers reads and that resume exactly."""
from __future__ import annotations

import os

import pytest
import torch

from bertforge.config import compose
from bertforge.errors import BertforgeError
from bertforge.pretraining.objectives import (ELECTRAObjective, GDES_DELTA, GradientDisentangledEmbedding,
                                           generator_config)
from bertforge.pretraining.recipes import resolve

os.environ.setdefault("HF_HUB_OFFLINE", "1")
V = 90


def tiny(**over):
    return compose("deberta-v2", "tiny", vocab_size=V, position_buckets=16, max_relative_positions=64, **over)


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (4, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[3, 17:] = 0
    ids[mask == 0] = 0
    labels = torch.full_like(ids, -100)
    pick = (torch.rand(ids.shape, generator=g) < 0.2) & mask.bool()
    labels[pick] = ids[pick]
    ids = ids.masked_fill(pick, V - 1)
    return {"input_ids": ids, "attention_mask": mask, "mlm_labels": labels}


def test_deberta_generator_is_half_depth_same_width():
    cfg = tiny(num_hidden_layers=4)
    gen = generator_config(cfg)
    assert (gen.model_type, gen.num_hidden_layers, gen.hidden_size) == ("deberta-v2", 2, cfg.hidden_size)
    model = ELECTRAObjective(cfg)
    assert model.config.model_type == "deberta-v2" and model.discriminator.bert.embeddings.position_embeddings is None


@pytest.mark.parametrize("sharing", ["none", "shared", "gdes"])
def test_what_each_sharing_mode_shares(sharing):
    torch.manual_seed(0)
    model = ELECTRAObjective(tiny(), embedding_sharing=sharing)
    d, g = model.discriminator.bert.embeddings, model.generator.bert.embeddings
    assert model.generator.cls.predictions.decoder.weight is g.word_embeddings.weight  # the generator's own tied head
    if sharing == "shared":
        assert d is g
    elif sharing == "none":
        assert d is not g and not ({id(p) for p in d.parameters()} & {id(p) for p in g.parameters()})
    else:
        assert isinstance(d.word_embeddings, GradientDisentangledEmbedding) and d.LayerNorm is g.LayerNorm
        assert not d.word_embeddings.delta.detach().any()  # E_delta starts at zero: E_D = E_G at step 0
        torch.testing.assert_close(d.word_embeddings.weight, g.word_embeddings.weight, rtol=0, atol=0)
    assert len({id(p) for p in model.parameters()}) == len(list(model.parameters()))


def test_gdes_keeps_the_rtd_gradient_out_of_the_generators_table():
    """The discriminator's loss moves E_delta and never E_G; the generator's MLM loss moves E_G."""
    torch.manual_seed(0)
    model = ELECTRAObjective(tiny(), embedding_sharing="gdes")
    b = batch()
    out = model(**b)
    table = model.generator.bert.embeddings.word_embeddings.weight
    delta = model.discriminator.bert.embeddings.word_embeddings.delta
    rtd_only = torch.autograd.grad(_rtd_loss(model, b), [table, delta], allow_unused=True)
    assert rtd_only[0] is None or float(rtd_only[0].abs().sum()) == 0.0
    assert float(rtd_only[1].abs().sum()) > 0
    out["loss"].backward()
    assert float(table.grad.abs().sum()) > 0 and float(delta.grad.abs().sum()) > 0
    # plain sharing, by contrast, sends the RTD gradient into the one table
    torch.manual_seed(0)
    shared = ELECTRAObjective(tiny(), embedding_sharing="shared")
    grad = torch.autograd.grad(_rtd_loss(shared, b), shared.discriminator.bert.embeddings.word_embeddings.weight)
    assert float(grad[0].abs().sum()) > 0


def _rtd_loss(model: ELECTRAObjective, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """The discriminator's BCE on a fixed corruption (every masked token replaced by token 5)."""
    corrupted = torch.where(b["mlm_labels"].ne(-100), torch.full_like(b["input_ids"], 5), b["input_ids"])
    labels = b["mlm_labels"].ne(-100).float()
    logits = model.discriminator(corrupted, b["attention_mask"])
    real = b["attention_mask"].bool()
    return torch.nn.functional.binary_cross_entropy_with_logits(logits[real], labels[real])


def test_gdes_checkpoint_is_a_plain_deberta_and_resumes_exactly(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = ELECTRAObjective(tiny(), embedding_sharing="gdes")
    with torch.no_grad():  # a trained E_delta
        model.discriminator.bert.embeddings.word_embeddings.delta.normal_(0, 0.05)
    before = model.discriminator.bert.embeddings.word_embeddings.delta.detach().clone()
    model.eval().save_pretrained(tmp_path)
    assert (tmp_path / GDES_DELTA).is_file()
    assert torch.equal(model.discriminator.bert.embeddings.word_embeddings.delta, before)  # saving changes nothing
    merged = (model.generator.bert.embeddings.word_embeddings.weight
              + model.discriminator.bert.embeddings.word_embeddings.delta).detach()
    disc, info = transformers.DebertaV2Model.from_pretrained(tmp_path / "discriminator", output_loading_info=True)
    assert not info["missing_keys"], info  # (the RTD head is extra: transformers has no DeBERTa RTD class)
    torch.testing.assert_close(disc.embeddings.word_embeddings.weight, merged, rtol=0, atol=0)
    gen, info = transformers.DebertaV2ForMaskedLM.from_pretrained(tmp_path / "generator", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    b = batch(1)
    with torch.no_grad():
        real = b["attention_mask"].bool()
        hidden = model.discriminator.bert(b["input_ids"], b["attention_mask"]).last_hidden_state
        torch.testing.assert_close(hidden[real], disc.eval()(input_ids=b["input_ids"],
                                   attention_mask=b["attention_mask"]).last_hidden_state[real], atol=1e-5, rtol=0)
        theirs = gen.eval()(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        torch.testing.assert_close(model.generator(b["input_ids"], b["attention_mask"])[real], theirs[real],
                                   atol=1e-5, rtol=0)
    torch.manual_seed(1)
    again = ELECTRAObjective(tiny(), embedding_sharing="gdes")
    again.load_pretrained(tmp_path)
    for (name, p), q in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("sharing", ["none", "shared", "gdes"])
def test_saving_and_loading_draw_no_random_numbers(tmp_path, sharing):
    """A checkpoint records the RNG state before the weights are written; a save that drew numbers (a table built
    by nn.Embedding's initialiser) would leave the run elsewhere than a resume from that checkpoint starts."""
    torch.manual_seed(0)
    model = ELECTRAObjective(tiny(), embedding_sharing=sharing)
    state = torch.get_rng_state()
    model.save_pretrained(tmp_path)
    model.load_pretrained(tmp_path)
    assert torch.equal(torch.get_rng_state(), state)


def test_other_families_train_rtd_in_electras_layout():
    """A family without a replaced-token detection layout of its own trains it in the one that hosts the others'
    (ELECTRA's), not in the first family that has one (DeBERTa's file sorts first)."""
    model = ELECTRAObjective(compose("bert", "tiny", vocab_size=V))
    assert model.config.model_type == "electra" and model.generator.config.hidden_size == 32  # a quarter wide
    assert ELECTRAObjective(tiny()).config.model_type == "deberta-v2"


def test_a_recipe_on_a_family_with_its_own_tokenizer_trains_that_layout():
    """--family swaps the tokenizer kind for the family's own layout where the recipe's is of the same model."""
    assert resolve("xlm-roberta").tokenizer_kind == "xlm-roberta"
    assert resolve("albert", model_type="xlm-roberta", objective="mlm").tokenizer_kind == "xlm-roberta"
    assert resolve("roberta", model_type="xlm-roberta").tokenizer_kind == "bpe"  # a BPE recipe keeps its BPE
    assert resolve("deberta-v3", model_type="electra").tokenizer_kind == "deberta-v2"


def test_deberta_v3_recipe_and_family_choice():
    r = resolve("deberta-v3")
    # declared by the family file, with the family's own tokenizer layout
    assert (r.objective, r.model_type, r.embedding_sharing, r.tokenizer_kind) == ("electra", "deberta-v2", "gdes",
                                                                                   "deberta-v2")
    assert resolve("electra", model_type="deberta-v2", embedding_sharing="none").embedding_sharing == "none"
    with pytest.raises(BertforgeError, match="--family bert: replaced-token detection trains"):
        resolve("electra", model_type="bert")
    with pytest.raises(BertforgeError, match="--embedding-sharing is what replaced-token detection"):
        resolve("bert", embedding_sharing="gdes")
    with pytest.raises(BertforgeError, match="NSP.*deberta-v2|a deberta-v2 model has no pooler"):
        resolve("bert", model_type="deberta-v2")  # MLM + NSP: the sentence head needs BERT's pooler
    cfg = r.model_config("bert-tiny", vocab_size=100, pad_token_id=0, seq_len=128)
    assert cfg.model_type == "deberta-v2" and cfg.position_embedding_type == "disentangled"


def test_pretrain_deberta_v3_through_the_cli(tmp_path):
    """`pretrain --recipe deberta-v3` trains a DeBERTa-layout tokenizer and model; the top-level folder is the
    discriminator, which `finetune` starts from; `--recipe electra --family deberta-v2` is the same objective."""
    import random

    from bertforge.cli import main
    from bertforge.config import ModelConfig
    from bertforge.tokenization import Tokenizer

    rng = random.Random(0)
    words = "the a movie film plot actor was is very good bad great dull and of in to it story long".split()
    (tmp_path / "c.txt").write_text("\n\n".join(" ".join(rng.choices(words, k=30)) for _ in range(120)))
    args = ["--corpus", str(tmp_path / "c.txt"), "--size", "bert-tiny", "--seq-len", "32", "--batch-size", "8",
            "--max-steps", "3", "--vocab-size", "60", "--precision", "fp32", "--no-progress", "--log-every", "1"]
    assert main(["pretrain", "--recipe", "deberta-v3", "--out", str(tmp_path / "v3"), *args]) == 0
    assert ModelConfig.from_file(tmp_path / "v3").model_type == "deberta-v2"
    assert Tokenizer.from_pretrained(tmp_path / "v3").layout.hf_class == "DebertaV2Tokenizer"
    assert (tmp_path / "v3" / GDES_DELTA).is_file() and (tmp_path / "v3" / "generator").is_dir()
    assert main(["pretrain", "--recipe", "electra", "--family", "deberta-v2", "--embedding-sharing", "none",
                 "--out", str(tmp_path / "e"), *args]) == 0
    assert ModelConfig.from_file(tmp_path / "e" / "generator").num_hidden_layers == 1  # half of bert-tiny's 2
    assert not (tmp_path / "e" / GDES_DELTA).exists()
