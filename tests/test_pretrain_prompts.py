"""Fill-mask prompts mask one whole word that is a single token, and candidates read as text, for every tokenizer
kind (byte-level BPE's word-initial pieces look like words by themselves)."""
from __future__ import annotations

import random

import pytest

from bertforge.analysis.fill_mask import token_text
from bertforge.pretraining.prompts import mask_one_word
from bertforge.tokenization import Tokenizer

WORDS = "the cat sat on mat and dog ran to park".split()
ALICE = "the dog ran to ALICE’S ADVENTURES IN the park"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Tokenizer]:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(10)) for _ in range(300)] + [ALICE] * 3
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    # BPE at 300: the 256 bytes plus merges enough for the frequent words, not for "ADVENTURES"
    return {kind: Tokenizer.train(lines, kind=kind, vocab_size=300 if kind == "bpe" else 120)
            for kind in ("bpe", "wordpiece")}


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_the_masked_word_is_whole_and_a_single_token(tokenizers, kind):
    tok = tokenizers[kind]
    text = "the cat sat on the mat and the dog ran to the park"
    masked, word = mask_one_word(text, tok)
    assert masked.replace(tok.mask_token, word, 1) == text
    assert word in WORDS and f" {tok.mask_token} " in masked  # a whole word, spaces kept on both sides
    assert len(tok.encode_ids([f" {word}"])[0]) == 1
    assert word == "and"  # the middle word (token 7 of 13)


def test_bpe_never_masks_a_piece_of_a_word(tokenizers):
    """The bug: "ĠA" + "DV" + ... starts a word, so masking it left `ALICE’S <mask>DVENTURES`-style prompts."""
    tok = tokenizers["bpe"]
    assert len(tok.encode_ids([" ADVENTURES"])[0]) > 1  # the word is several pieces here
    masked, word = mask_one_word(ALICE, tok)
    assert word in ("dog", "ran", "the") and "ADVENTURES" in masked
    assert mask_one_word("ALICE’S ADVENTURES IN WONDERLAND", tok) is None  # no single-token word: no prompt
    # nor the front of a contraction or a hyphenated word, though "cat" is a word to the pre-tokenizer
    for text in ("a b cat’s c d", "a b cat-like c d"):
        assert mask_one_word(text, tok) is None, text
    assert mask_one_word("a b cat, c d", tok) == ("a b <mask>, c d", "cat")  # closing punctuation is fine


def test_candidates_read_as_text(tokenizers):
    bpe = tokenizers["bpe"]
    cat = bpe.encode_ids([" cat"])[0][0]
    assert bpe.convert_ids_to_tokens([cat]) == ["Ġcat"] and token_text(bpe, cat) == "cat"
    assert token_text(bpe, bpe.mask_token_id) == "<mask>"  # specials keep their name
    wp = tokenizers["wordpiece"]
    assert token_text(wp, wp.token_to_id("cat")) == "cat"
