"""XLM-RoBERTa (Conneau et al. 2020): RoBERTa's encoder and training recipe over 100 languages, with a
SentencePiece unigram vocabulary of 250,002 (<s> = 0, <pad> = 1, </s> = 2, <unk> = 3, the pieces, <mask> last;
pairs as <s> A </s></s> B </s>, one segment). Its checkpoints are RoBERTa's layout under `roberta.` with
XLMRoberta class names, so everything but the names, the tokenizer and the recipe is RoBERTa's row."""
import dataclasses

from bertforge.families.family import TokenizerLayout
from bertforge.families.roberta import FAMILY as ROBERTA

MODEL_TYPE = "xlm-roberta"

# transformers' XLMRobertaTokenizer (without a SentencePiece character map): no normaliser, split on whitespace,
# "▁" before every word, always cased; <mask> takes the space before it, as in the published tokenizer.
TOKENIZER = TokenizerLayout(
    model="unigram", specials={"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"},
    frame="double-sep", hf_class="XLMRobertaTokenizer",
    special_map=(("bos_token", "cls"), ("eos_token", "sep"), ("unk_token", "unk"), ("sep_token", "sep"),
                 ("pad_token", "pad"), ("cls_token", "cls"), ("mask_token", "mask")),
    config={"add_prefix_space": True}, marker="<s>", normalise=False, cased=True, mask_lstrip=True,
    after_pieces=("mask",))

RECIPES = (
    # Conneau et al. 2020: RoBERTa's recipe (MLM, dynamic masks, full sentences) over many languages with a
    # SentencePiece unigram vocabulary in XLM-R's layout.
    dict(name=MODEL_TYPE, objective="mlm", masking="token", dynamic=True, input_format="full-sentences",
         tokenizer_kind=MODEL_TYPE),
)

FAMILY = dataclasses.replace(
    ROBERTA, model_type=MODEL_TYPE, hf_prefix="XLMRoberta",
    head_classes={"mlm": "XLMRobertaForMaskedLM", "ltr": "XLMRobertaForCausalLM"},
    presets={"xlm-roberta-base": ("base", {}), "xlm-roberta-large": ("large", {})},
    recipes=RECIPES, tokenizer=TOKENIZER, plain_tokenizers={},
    defaults=dataclasses.replace(ROBERTA.defaults, vocab_size=250002),
    # Longformer's checkpoints are RoBERTa's byte-level BPE models
    verbs=dataclasses.replace(ROBERTA.verbs, long_variant=None))
