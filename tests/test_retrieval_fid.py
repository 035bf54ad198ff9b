"""Fusion-in-Decoder on the one encoder-decoder: with one passage it is the generator itself; the decoder's view
of the joined encodings does not depend on the passages' order; it learns; it decodes through generation.search."""
from __future__ import annotations

import pytest
import torch

from bertforge.config.seq2seq import compose_seq2seq
from bertforge.errors import BertforgeError
from bertforge.generation.search import generate_ids
from bertforge.model import Seq2SeqLM
from bertforge.retrieval.fid import FusionInDecoder, fid_input, generate_fused

V, K, B, S = 61, 3, 2, 8


@pytest.fixture(scope="module", params=["t5", "bart"])
def generator(request):
    torch.manual_seed(0)
    return Seq2SeqLM(compose_seq2seq(request.param, "tiny", vocab_size=V, encoder_layers=1,
                                     decoder_layers=2)).eval()


def batch(pad: int):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(5, V, (B * K, S), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:], mask[3, 2:] = 0, 0
    labels = torch.randint(5, V, (B, 5), generator=g)
    return ids.masked_fill(mask == 0, pad), mask, labels


def test_one_passage_is_the_generator_itself(generator):
    ids, mask, labels = batch(generator.config.pad_token_id)
    rows = torch.arange(0, B * K, K)
    with torch.no_grad():
        fid = FusionInDecoder(generator, 1)(ids[rows], mask[rows], labels=labels)
        plain = generator(ids[rows], mask[rows], labels=labels)
    torch.testing.assert_close(fid["logits"], plain["logits"])
    torch.testing.assert_close(fid["loss"], plain["loss"])


def test_the_passages_order_does_not_matter(generator):
    ids, mask, labels = batch(generator.config.pad_token_id)
    perm = torch.tensor([2, 0, 1, 4, 5, 3])  # each question's passages shuffled among themselves
    model = FusionInDecoder(generator, K)
    with torch.no_grad():
        a = model(ids, mask, labels=labels)["logits"]
        b = model(ids[perm], mask[perm], labels=labels)["logits"]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_every_passage_is_read(generator):
    ids, mask, labels = batch(generator.config.pad_token_id)
    model = FusionInDecoder(generator, K)
    changed = ids.clone()
    changed[K - 1, 0] = (changed[K - 1, 0] + 1 - 5) % (V - 5) + 5  # the first question's last passage
    with torch.no_grad():
        a, b = model(ids, mask, labels=labels)["logits"], model(changed, mask, labels=labels)["logits"]
    assert not torch.allclose(a[0], b[0]) and torch.allclose(a[1], b[1])


def test_decoding_one_passage_equals_the_generator(generator):
    ids, mask, _ = batch(generator.config.pad_token_id)
    rows = torch.arange(0, B * K, K)
    for opts in ({"greedy": True}, {"num_beams": 3}):
        fused = generate_fused(generator, ids[rows], mask[rows], 1, max_new_tokens=6, **opts)
        plain = generate_ids(generator, ids[rows], mask[rows], max_new_tokens=6, **opts)
        assert fused.tolist() == plain.tolist()
    assert generate_fused(generator, ids, mask, K, max_new_tokens=6, greedy=True).shape[0] == B


def test_it_learns_and_refuses_bad_shapes(generator):
    import copy

    model = FusionInDecoder(copy.deepcopy(generator), K).train()
    ids, mask, labels = batch(generator.config.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(10):
        loss = model(ids, mask, labels=labels)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    with pytest.raises(BertforgeError, match="multiple"):
        FusionInDecoder(generator, 4)(ids, mask, labels=labels)
    with pytest.raises(BertforgeError, match="n_passages"):
        FusionInDecoder(generator, 0)
    assert fid_input("who?", "T", "text") == "question: who? title: T context: text"
