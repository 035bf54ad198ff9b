"""Recipes resolve to the published setups, flags flip one arm, bad combinations fail clearly; the embedded
default corpus is prose from the stdlib's documentation."""
from __future__ import annotations

import pytest

from bertforge.errors import BertforgeError
from bertforge.pretraining.default_corpus import _paragraphs, _pydoc_topics
from bertforge.pretraining.recipes import RECIPES, resolve
from bertforge.pretraining.inputs import builder_name


def test_recipes_match_their_papers():
    b, r, a, s, e = (RECIPES[k] for k in ("bert", "roberta", "albert", "spanbert", "electra"))
    assert (b.objective, b.dynamic, b.input_format, b.tokenizer_kind, b.dupe_factor) == \
        ("mlm+nsp", False, "segment-pair", "wordpiece", 5)
    assert (r.objective, r.dynamic, r.input_format, r.tokenizer_kind, r.model_type) == \
        ("mlm", True, "full-sentences", "bpe", "roberta")
    assert (a.objective, a.tokenizer_kind, a.model_type) == ("mlm+sop", "unigram", "albert")
    assert (s.objective, s.masking) == ("span+sbo", "span")
    assert e.objective == "electra" and e.model_type == "electra"
    cfg = a.model_config("bert-mini", vocab_size=1000, pad_token_id=0, seq_len=128)
    assert (cfg.embedding_size, cfg.share_layers, cfg.hidden_size, cfg.hidden_act) == (128, "all", 256, "gelu_new")
    assert builder_name(a) == "sop" and builder_name(b) == "segment_pair" and builder_name(r) == "full_sentences"


def test_one_flag_flips_one_arm():
    assert resolve("bert", objective="mlm+sop").objective == "mlm+sop"
    assert resolve("bert", dynamic=True).dynamic is True
    assert resolve("roberta", dynamic=False).dynamic is False
    assert resolve("bert", masking="whole_word").masking == "whole_word"
    assert resolve("bert", objective="span+sbo").masking == "span"  # SBO implies span masking
    assert resolve("roberta", input_format="doc-sentences").input_format == "doc-sentences"
    assert resolve("bert", dynamic=None) == RECIPES["bert"]  # None keeps the recipe's value


@pytest.mark.parametrize("over,msg", [
    (dict(objective="mlm+nsp", input_format="full-sentences"), "needs sentence pairs"),
    (dict(objective="span+sbo", masking="token"), "needs --masking span"),
    (dict(masking="words"), "--masking: unknown"),
])
def test_bad_combinations_fail_with_one_line(over, msg):
    with pytest.raises(BertforgeError, match=msg):
        resolve("bert", **over)
    with pytest.raises(BertforgeError, match="--recipe: unknown"):
        resolve("gpt2")


def test_default_corpus_keeps_prose_drops_code():
    doc = """Return the number of items in a container, counting nested ones as well.

    >>> len([1, 2])
    2

    short

    The argument may be a sequence (such as a string, bytes, tuple, list, or range) or a collection."""
    paras = _paragraphs(doc)
    assert paras == ["Return the number of items in a container, counting nested ones as well.",
                     "The argument may be a sequence (such as a string, bytes, tuple, list, or range) or a collection."]


def test_pydoc_topics_are_read_without_importing():
    import sysconfig
    from pathlib import Path
    docs = _pydoc_topics(Path(sysconfig.get_paths()["stdlib"]))
    assert len(docs) > 30 and all(len(d) >= 2 for d in docs)
    assert any("assert" in p for d in docs for p in d)
