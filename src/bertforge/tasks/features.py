"""Turn reader examples into model inputs (tensors) and map tagging predictions back to words.

Every builder takes a ``tokenizer`` with the bertforge contract (``bertforge.tokenization.Tokenizer``):
``tok(texts, pairs, max_length, padding, truncation, return_tensors, return_offsets, ...) -> dict`` and
``tok.build_inputs``. Outputs are dicts of ``torch.long`` tensors (labels ``float`` for regression) whose keys
are the model's ``forward`` arguments: ``input_ids``, ``token_type_ids``, ``attention_mask``, ``labels``
(``labels`` only when every example is labelled), so ``model(**batch)`` works on any slice of them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from bertforge.errors import BertforgeError
from bertforge.tasks.readers import ChoiceExample, TaggingExample, TextExample

IGNORE_INDEX = -100  # label value the cross-entropy loss skips (non-first sub-tokens, specials, padding)


def _labels_or_none(values: list, what: str) -> list | None:
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        raise BertforgeError(f"some {what} examples are labelled and some are not")
    return values


def encode_text_examples(
    examples: Sequence[TextExample],
    tokenizer,
    label_list: Sequence[str] | None,
    max_length: int = 128,
    padding: str = "longest",
) -> dict[str, torch.Tensor]:
    """Sentence or sentence-pair classification / regression inputs.

    ``label_list`` maps label strings to ids (``TaskSpec.labels``); None means regression (float labels).
    Pairs are truncated longest-first to ``max_length``; ``padding="longest"`` pads to the longest example
    given, ``"max_length"`` to ``max_length``."""
    if not examples:
        raise BertforgeError("no examples to encode")
    has_pair = [ex.text_pair is not None for ex in examples]
    if any(has_pair) and not all(has_pair):
        raise BertforgeError("mixing single sentences and sentence pairs in one task")
    enc = tokenizer(
        [ex.text for ex in examples],
        [ex.text_pair for ex in examples] if has_pair[0] else None,
        max_length=max_length,
        padding=padding,
        truncation=True,
        return_tensors="pt",
    )
    out = {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    labels = _labels_or_none([ex.label for ex in examples], "text")
    if labels is not None:
        if label_list is None:
            out["labels"] = torch.tensor([float(v) for v in labels], dtype=torch.float)
        else:
            index = {lab: i for i, lab in enumerate(label_list)}
            missing = sorted({str(v) for v in labels if v not in index})
            if missing:
                raise BertforgeError(f"labels {missing} are not in the label list {list(label_list)}")
            out["labels"] = torch.tensor([index[v] for v in labels], dtype=torch.long)
    return out


# ----------------------------------------------------------------------------------------------- tagging


def encode_tagging_examples(
    examples: Sequence[TaggingExample],
    tokenizer,
    label_list: Sequence[str],
    max_length: int = 128,
    padding: str = "longest",
) -> dict[str, torch.Tensor]:
    """Token classification inputs for pre-tokenised sentences.

    Words are joined with single spaces and each sub-token is assigned to a word by its character offset
    (robust to tokenisers whose own word splitting differs from CoNLL's, e.g. "1996-08-30"). The label of a
    word goes on its first sub-token; other sub-tokens, specials and padding get ``IGNORE_INDEX``.
    Besides the model inputs the dict holds ``word_index`` [N, T]: the word a first sub-token starts, -1
    elsewhere; pop it before ``model(**batch)`` and keep it for ``tags_from_token_predictions``. Words cut
    off by ``max_length`` have no first sub-token (they are predicted "O")."""
    if not examples:
        raise BertforgeError("no examples to encode")
    texts, starts = [], []
    for ex in examples:
        pos, s = 0, []
        for w in ex.tokens:
            s.append(pos)
            pos += len(w) + 1
        texts.append(" ".join(ex.tokens))
        starts.append(s)
    enc = tokenizer(texts, max_length=max_length, padding=padding, truncation=True, return_tensors=None,
                    return_offsets=True, return_special_tokens_mask=True)
    word_index = []
    for i, ex in enumerate(examples):
        row, seen = [], set()
        for (s, e), special, att in zip(enc["offset_mapping"][i], enc["special_tokens_mask"][i],
                                        enc["attention_mask"][i]):
            w = -1
            if att and not special and e > s:
                w = bisect.bisect_right(starts[i], s) - 1
                if w in seen:
                    w = -1  # a continuation sub-token of a word already labelled
                else:
                    seen.add(w)
            row.append(w)
        word_index.append(row)
    out = {k: torch.tensor(enc[k], dtype=torch.long) for k in ("input_ids", "token_type_ids", "attention_mask")}
    wi = torch.tensor(word_index, dtype=torch.long)
    out["word_index"] = wi
    tags = _labels_or_none([ex.tags or None for ex in examples], "tagging")
    if tags is not None:
        index = {t: j for j, t in enumerate(label_list)}
        labels = torch.full_like(wi, IGNORE_INDEX)
        for i, ex in enumerate(examples):
            if len(ex.tags) != len(ex.tokens):
                raise BertforgeError(f"example {ex.guid or i}: {len(ex.tags)} tags for {len(ex.tokens)} words")
            for t, w in enumerate(word_index[i]):
                if w >= 0:
                    tag = ex.tags[w]
                    if tag not in index:
                        raise BertforgeError(f"example {ex.guid or i}: tag {tag!r} is not in the label list")
                    labels[i, t] = index[tag]
        out["labels"] = labels
    return out


def tags_from_token_predictions(
    predictions: torch.Tensor | Sequence[Sequence[int]],
    word_index: torch.Tensor,
    num_words: Sequence[int],
    label_list: Sequence[str],
    fill: str = "O",
) -> list[list[str]]:
    """Word-level tags from token-level predictions: each word takes the prediction on its first
    sub-token. ``predictions``: label ids [N, T] (or logits [N, T, K], arg-maxed); ``word_index`` from
    ``encode_tagging_examples``; ``num_words``: words per example (``len(ex.tokens)``). Words without a
    sub-token (truncated away) get ``fill``."""
    pred = torch.as_tensor(predictions)
    if pred.dim() == 3:
        pred = pred.argmax(-1)
    if pred.shape != word_index.shape:
        raise BertforgeError(f"predictions {tuple(pred.shape)} and word_index {tuple(word_index.shape)} differ")
    out = []
    for i, n in enumerate(num_words):
        tags = [fill] * n
        for t in torch.nonzero(word_index[i] >= 0).flatten().tolist():
            tags[int(word_index[i, t])] = label_list[int(pred[i, t])]
        out.append(tags)
    return out


# ----------------------------------------------------------------------------------------------- multiple choice


def encode_choice_examples(
    examples: Sequence[ChoiceExample],
    tokenizer,
    max_length: int = 128,
    padding: str = "longest",
) -> dict[str, torch.Tensor]:
    """Multiple-choice inputs: ``(context, ending_i)`` pairs, shaped [N, num_choices, T]; labels [N]."""
    if not examples:
        raise BertforgeError("no examples to encode")
    c = len(examples[0].endings)
    for ex in examples:
        if len(ex.endings) != c:
            raise BertforgeError(f"example {ex.guid}: {len(ex.endings)} endings, expected {c} like the first")
    enc = tokenizer(
        [ex.context for ex in examples for _ in range(c)],
        [e for ex in examples for e in ex.endings],
        max_length=max_length,
        padding=padding,
        truncation=True,
        return_tensors="pt",
    )
    out = {k: enc[k].view(len(examples), c, -1) for k in ("input_ids", "token_type_ids", "attention_mask")}
    labels = _labels_or_none([ex.label for ex in examples], "choice")
    if labels is not None:
        out["labels"] = torch.tensor(labels, dtype=torch.long)
    return out
