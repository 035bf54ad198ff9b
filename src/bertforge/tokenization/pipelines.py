"""The tokenizer pipelines of the reference models (normaliser, pre-tokenizer, post-processor, decoder) and their
special tokens, per kind; `bertforge.tokenization.Tokenizer` trains, loads and saves with them.

Kinds: "wordpiece" (BERT), "bpe" (RoBERTa's byte-level BPE; BART's is the same), "unigram" (ALBERT), "gpt2" (GPT-2's
byte-level BPE, one special token) and "t5": a Unigram model with T5's layout, <pad> = 0, </s> = 1, <unk> = 2, the
pieces, then 100 sentinels <extra_id_99> ... <extra_id_0> (so <extra_id_0> has the highest id, as in T5's
vocabulary); "</s>" ends every text and there is no [CLS] (its role is played by </s>, as <|endoftext|> plays every
role for GPT-2). T5's text is cased and not normalised: transformers' T5Tokenizer rebuilds the pipeline without a
normaliser unless given a SentencePiece character map, and a saved tokenizer must encode alike in both libraries.
"""
from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from bertforge.families import FAMILIES
from bertforge.families.family import TokenizerLayout

TOKENIZER_KINDS = ("wordpiece", "bpe", "unigram", "gpt2", "t5")
_MODEL_KIND = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}
ROLES = ("pad", "unk", "cls", "sep", "mask")

# Special tokens per kind, in id order (they get ids 0..4 when training).
SPECIAL_TOKENS: dict[str, dict[str, str]] = {
    "wordpiece": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "bpe": {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"},
    "unigram": {"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "gpt2": {"pad": "<|endoftext|>", "unk": "<|endoftext|>", "cls": "<|endoftext|>", "sep": "<|endoftext|>",
             "mask": None},
    # in this order so that the ids are T5's: <pad> 0, </s> 1, <unk> 2
    "t5": {"pad": "<pad>", "sep": "</s>", "unk": "<unk>", "cls": "</s>", "mask": None},
}
HF_TOKENIZER_CLASS = {"wordpiece": "BertTokenizerFast", "bpe": "RobertaTokenizerFast", "unigram": "AlbertTokenizerFast",
                      "gpt2": "GPT2TokenizerFast", "t5": "T5Tokenizer"}
ENDOFTEXT = "<|endoftext|>"
# The families' own SentencePiece layouts (DeBERTa-v2's, XLM-RoBERTa's), by the transformers class that loads them.
LAYOUTS: dict[str, TokenizerLayout] = {fam.tokenizer.tokenizer_class: fam.tokenizer
                                       for fam in FAMILIES.values() if fam.tokenizer is not None}
N_SENTINELS = 100  # T5's extra_ids


def sentinel(k: int) -> str:
    """T5's k-th sentinel token, <extra_id_k>."""
    return f"<extra_id_{k}>"



# ----------------------------------------------------------------------------------------------- pipelines

def _bert_pipeline(backend: Backend, lowercase: bool, strip_accents: bool | None = None,
                   chinese: bool = True) -> None:
    # strip_accents=None: accents are stripped exactly when lower-casing, as in the original BERT.
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese,
                                                    strip_accents=strip_accents, lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")


def _roberta_pipeline(backend: Backend) -> None:
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()


def _albert_pipeline(backend: Backend, lowercase: bool) -> None:
    # The normaliser and pre-tokenizer transformers' AlbertTokenizerFast rebuilds on load (keep_accents=not lowercase).
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if lowercase:
        steps += [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")


def layout_named(tokenizer_class: Any) -> TokenizerLayout | None:
    """The family layout a tokenizer_config.json's class names ("XLMRobertaTokenizer[Fast]"), or None."""
    return LAYOUTS.get(tokenizer_class.removesuffix("Fast")) if isinstance(tokenizer_class, str) else None


def _set_post_processor(backend: Backend, kind: str, specials: dict[str, str],
                        layout: TokenizerLayout | None = None) -> None:
    cls, sep = specials["cls"], specials["sep"]
    cls_id, sep_id = backend.token_to_id(cls), backend.token_to_id(sep)
    if layout is not None and layout.pair == "double_separator":  # <s> A </s></s> B </s>, all type ids 0
        backend.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 {sep}:0 $B:0 {sep}:0",
            special_tokens=[(cls, cls_id), (sep, sep_id)])
    elif kind == "bpe":  # <s> A </s></s> B </s>, all type ids 0
        backend.post_processor = processors.RobertaProcessing((sep, sep_id), (cls, cls_id),
                                                              trim_offsets=True, add_prefix_space=False)
    elif kind == "gpt2":  # GPT-2 adds nothing around a text
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    elif kind == "t5":  # A </s> (B </s>), all type ids 0
        backend.post_processor = processors.TemplateProcessing(
            single=f"$A:0 {sep}:0", pair=f"$A:0 {sep}:0 $B:0 {sep}:0", special_tokens=[(sep, sep_id)])
    else:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, cls_id), (sep, sep_id)])


def _t5_pipeline(backend: Backend) -> None:
    # transformers' T5Tokenizer pipeline (it rebuilds this one on load)
    backend.normalizer = None
    metaspace = dict(replacement="▁", prepend_scheme="always", split=True)
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(**metaspace)])
    backend.decoder = decoders.Metaspace(**metaspace)


def _sentinel_tokens() -> list[AddedToken]:
    """T5's sentinels in id order: <extra_id_99> first, <extra_id_0> last."""
    return [AddedToken(sentinel(k), special=True, normalized=False) for k in reversed(range(N_SENTINELS))]


def _special_added_tokens(kind: str, layout: TokenizerLayout | None = None) -> list[AddedToken]:
    """The special tokens in id order (a family layout's: its first ones, then its last)."""
    if layout is not None:
        return [AddedToken(tok, special=True, normalized=False) for tok in (*layout.first, *layout.last)]
    # RoBERTa's <mask> swallows the space before it, so "a <mask> b" masks the word " b"-style tokens correctly.
    unique = dict.fromkeys(t for t in SPECIAL_TOKENS[kind].values() if t is not None)  # GPT-2's one, once
    return [AddedToken(tok, special=True, normalized=False, lstrip=(kind == "bpe" and tok == "<mask>"))
            for tok in unique]


def _json_lowercases(node: Any) -> bool:
    """Whether a serialised normaliser lower-cases (BertNormalizer(lowercase=True) or a Lowercase step)."""
    if isinstance(node, dict):
        if node.get("type") == "Lowercase" or (node.get("type") == "BertNormalizer" and node.get("lowercase")):
            return True
        return any(_json_lowercases(v) for v in node.values())
    if isinstance(node, list):
        return any(_json_lowercases(v) for v in node)
    return False


def _token_str(value: Any) -> str | None:
    """A special token as written in tokenizer_config.json / special_tokens_map.json (string or AddedToken dict)."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None
