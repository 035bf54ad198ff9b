"""Fill-mask examples for a pretraining run: prompts mined from held-out sentences (one whole word masked) and
the model's top-k guesses for them, as decoded text."""
from __future__ import annotations

import torch
from torch import nn

from bertforge.analysis.fill_mask import fill_mask as analysis_fill_mask

# A masked word must stand alone: preceded by whitespace (or the start) and followed by whitespace, the end, or
# closing punctuation; never an apostrophe or a hyphen, which would leave a piece of it ("<mask>'t", "<mask>-like").
FOLLOWERS = set(".,;:!?)\"")


class _MaskedLMView:
    """An objective seen as the `MaskedLM` that `bertforge.analysis.fill_mask` expects (config, eval, parameters,
    __call__)."""

    def __init__(self, objective: nn.Module):
        self.objective, self.config = objective, objective.config

    def eval(self) -> "_MaskedLMView":
        self.objective.eval()
        return self

    def parameters(self):  # where the objective is: fill_mask puts its inputs there
        return self.objective.parameters()

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, positions=None) -> torch.Tensor:
        device = next(self.objective.parameters()).device
        to = (lambda t: None if t is None else t.to(device))
        return self.objective.predict_masked(to(input_ids), to(attention_mask), to(token_type_ids), to(positions))


def fill_mask(model: nn.Module, tok, texts: list[str], top_k: int = 5) -> list[dict]:
    """Top-k predictions (decoded text) for the first mask token of each text (via bertforge.analysis.fill_mask)."""
    view = _MaskedLMView(model)
    out = []
    for text in texts:
        first = analysis_fill_mask(view, tok, text, top_k=top_k)[0]
        out.append({"text": text, "predictions": [{"token": c.token, "score": round(float(c.probability), 4)}
                                                  for c in first]})
    return out


def mask_one_word(text: str, tok) -> tuple[str, str] | None:
    """(text with one word replaced by the mask token, that word), or None when no word qualifies.

    The word is a single token of the tokenizer (by its word ids), made of at least 3 letters, standing alone in
    the text (by its character offsets), and as near the middle of the sentence as possible. Working on the text,
    not on token symbols, is what keeps byte-level BPE and SentencePiece right: their word-initial pieces ("Ġadv"
    of "adventures") look like words by themselves.
    """
    enc = tok([text], return_tensors=None, padding=False, return_offsets=True, return_word_ids=True)
    word_ids, offsets = enc["word_ids"][0], enc["offset_mapping"][0]
    content = [i for i, w in enumerate(word_ids) if w >= 0]
    pieces: dict[int, int] = {}
    for i in content:
        pieces[word_ids[i]] = pieces.get(word_ids[i], 0) + 1
    middle = content[len(content) // 2] if content else 0
    for i in sorted(content[2:-2], key=lambda i: abs(i - middle)):
        if pieces[word_ids[i]] != 1:
            continue
        start, end = offsets[i]
        while start < end and text[start].isspace():  # offsets of "Ġword" / "▁word" may include the space
            start += 1
        word = text[start:end]
        if not (word.isalpha() and len(word) >= 3):
            continue
        if (start == 0 or text[start - 1].isspace()) and (end == len(text) or text[end].isspace()
                                                          or text[end] in FOLLOWERS):
            return text[:start] + tok.mask_token + text[end:], word
    return None


def fill_mask_prompts(corpus, tok, n: int) -> list[tuple[str, str]]:
    """Up to n (masked text, answer) pairs: the first sentence of 8-40 tokens of each held-out document, with one
    whole word masked (see `mask_one_word`); one sentence per document and no prompt twice, for variety."""
    prompts: list[tuple[str, str]] = []
    for d in range(len(corpus) if n > 0 else 0):
        for sent in corpus.document(d):
            ids = [int(i) for i in sent]
            if not 8 <= len(ids) <= 40:
                continue
            prompt = mask_one_word(tok.decode(ids).strip(), tok)
            if prompt is not None and prompt not in prompts:  # documents can open alike: show each prompt once
                prompts.append(prompt)
            break
        if len(prompts) >= n:
            break
    return prompts
