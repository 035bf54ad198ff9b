"""REALM's pieces by hand: the marginal MLM loss over retrieved documents, the masked-target log-probabilities,
salient span masking."""
from __future__ import annotations

import math

import pytest
import torch

from bertforge.errors import BertforgeError
from bertforge.retrieval.realm import marginal_mlm_loss, masked_token_logprobs, salient_spans, span_tokens


def test_marginal_loss_by_hand():
    """Two documents, priors softmax([log 3, 0]) = (0.75, 0.25); p(y|z1) = 0.2 * 0.5, p(y|z2) = 0.8 * 1.0:
    p(y|x) = 0.75 * 0.1 + 0.25 * 0.8 = 0.275."""
    lp = torch.log(torch.tensor([[[0.2, 0.5], [0.8, 1.0]]]))
    scores = torch.tensor([[math.log(3.0), 0.0]])
    torch.testing.assert_close(marginal_mlm_loss(lp, scores), torch.tensor(-math.log(0.275)))


def test_the_gradient_reaches_the_retrieval_scores_toward_the_helpful_document():
    lp = torch.log(torch.tensor([[[0.01], [0.9]]]))
    scores = torch.zeros(1, 2, requires_grad=True)
    marginal_mlm_loss(lp, scores).backward()
    assert scores.grad[0, 1] < 0 < scores.grad[0, 0]  # descending raises the helpful document's score


def test_masked_token_logprobs_pick_each_sentences_targets():
    B, k, T, V = 2, 3, 5, 7
    logits = torch.randn(B * k, T, V)
    labels = torch.full((B, T), -100)
    labels[0, 1], labels[0, 3], labels[1, 2] = 4, 6, 0
    got = masked_token_logprobs(logits, labels, k)
    assert got.shape == (B, k, 2)
    full = torch.log_softmax(logits, -1).view(B, k, T, V)
    for z in range(k):
        torch.testing.assert_close(got[0, z], torch.stack([full[0, z, 1, 4], full[0, z, 3, 6]]))
        torch.testing.assert_close(got[1, z, 0], full[1, z, 2, 0])
        assert got[1, z, 1] == 0  # the second sentence has one target: its padding adds nothing
    with pytest.raises(BertforgeError, match="do not match"):
        masked_token_logprobs(logits, labels, 2)


@pytest.mark.parametrize("text, want", [
    ("The Eiffel Tower was finished in March 1889 in Paris.", ["Eiffel Tower", "March 1889", "Paris"]),
    ("In 1969, Neil Armstrong walked on the Moon.", ["1969", "Neil Armstrong", "Moon"]),
    ("He was born on 4 July 1776 in the United States of America.", ["4 July 1776", "United States of America"]),
    ("Nothing here is named at all.", []),
    ("Rome fell in the 5th century.", ["5th century"]),
    ("The Beatles played in the 1960s.", ["Beatles", "1960s"]),
])
def test_salient_spans(text, want):
    assert [text[s:e] for s, e in salient_spans(text)] == want


def test_span_tokens_follow_offsets():
    offsets = [(0, 0), (0, 3), (4, 10), (10, 12), (13, 17), (0, 0)]  # [CLS] The Eiffel (Tow)er ... [SEP]
    assert span_tokens(offsets, (4, 12)) == [2, 3]
    assert span_tokens(offsets, (0, 0)) == []
