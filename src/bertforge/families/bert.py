"""BERT (Devlin et al. 2019): the encoder every other family is a configuration of. bertforge's canonical tensor
names are BERT's (`bert.embeddings...`, `bert.encoder.layer.N...`, `cls.predictions...`), so it needs no rules;
its presets are the sizes themselves (`bert-tiny` ... `bert-large`, `config.sizes.SIZES`). SpanBERT and StructBERT
are recipes of the same encoder."""
from bertforge.families.family import Family, StackTraits, VerbDefaults
from bertforge.families.record.tokenizer import ROLE_ENTRIES, TokenizerLayout

RECIPES = (
    # Devlin et al. 2019: MLM + NSP on segment pairs, masks fixed at preparation time (dupe_factor copies).
    dict(name="bert", objective="mlm+nsp", masking="token", dynamic=False, input_format="segment-pair",
         tokenizer_kind="wordpiece", dupe_factor=5),
    # Joshi et al. 2020: span masking + span-boundary objective, single segments, no NSP.
    dict(name="spanbert", objective="span+sbo", masking="span", dynamic=True, input_format="full-sentences",
         tokenizer_kind="wordpiece"),
    # Wang et al. 2020: BERT's setup with NSP replaced by the three-way sentence-structural task and the
    # word-structural one (5% of trigrams shuffled) added to MLM.
    dict(name="structbert", objective="structbert", masking="token", dynamic=False, input_format="segment-pair",
         tokenizer_kind="wordpiece", dupe_factor=5),
    # Lee et al. 2019 (ORQA): the Inverse Cloze Task pretrains a retriever's towers on raw text (a sentence finds
    # its block); the masking and input fields do not apply (bertforge.retrieval.ict).
    dict(name="ict", objective="ict", masking="token", dynamic=True, input_format="doc-sentences",
         tokenizer_kind="wordpiece"),
    # Guu et al. 2020 (REALM): MLM with a retrieved document, salient spans (names, dates) masked whole; the reader
    # and the retriever's towers train together (bertforge.pretraining.realm)
    dict(name="realm", objective="realm", masking="span", dynamic=True, input_format="doc-sentences",
         tokenizer_kind="wordpiece"),
)

# BERT's WordPiece ("wordpiece"): [PAD] [UNK] [CLS] [SEP] [MASK] at 0-4, "##" continuations, [CLS] A [SEP] B [SEP]
PLAIN_TOKENIZERS = {"wordpiece": TokenizerLayout(
    model="wordpiece", specials={"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    frame="cls-sep", hf_class="BertTokenizerFast", special_map=ROLE_ENTRIES,
    config={"tokenize_chinese_chars": True, "strip_accents": None})}

FAMILY = Family(
    "bert", "Bert", "bert",
    head_classes={"mlm": "BertForMaskedLM", "pretraining": "BertForPreTraining",
                  "ltr": "BertLMHeadModel"},
    recipes=RECIPES,
    plain_tokenizers=PLAIN_TOKENIZERS,
    structure=StackTraits(
        causal_encoder=True),
    verbs=VerbDefaults(
        distils_to="distilbert",
        long_variant="longformer"))
