"""T5 (Raffel et al. 2020): a 32k SentencePiece (+100 sentinels = 32128) with <pad>=0 (also the decoder's start),
</s>=1; RMSNorm before each sub-block, a bucketed relative position bias (no absolute positions: n_positions only
bounds prompts, 512), no Linear biases, unscaled attention scores. Its config.json is `T5Config`'s; its tensor
names number a block's sub-layers 0, 1 (, 2)."""
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families.family import (EITHER_MLP, ENCODER_DECODER, FAN_IN_INIT, CheckpointLayout, ConfigSchema,
                                       Defaults, Family, Seq2SeqTraits, StackTraits, TokenizerLayout, VerbDefaults,
                                       token_id)
from bertforge.families.record.schema import (BERT_CHECKS, EPS, FFN, HEADS, INIT, LAYERS, MAX_HEADS, MAX_POSITIONS,
                                              POSITIONS, RATE, SOME_LAYERS, SOME_WIDTH, SWITCH, TEXT, WIDTH, Field,
                                              checks)

_STACK = r"^(encoder|decoder)\."


def write_config(cfg: Any) -> dict[str, Any]:
    act = cfg.activation.lower()
    proj = ("gated-gelu" if act == "gelu_new" else f"gated-{act}") if cfg.gated_ffn else act
    return dict(model_type="t5", vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.d_kv,
                d_ff=cfg.encoder_ffn_dim, num_layers=cfg.encoder_layers, num_decoder_layers=cfg.decoder_layers,
                num_heads=cfg.encoder_attention_heads,
                relative_attention_num_buckets=cfg.relative_attention_num_buckets,
                relative_attention_max_distance=cfg.relative_attention_max_distance, dropout_rate=cfg.dropout,
                layer_norm_epsilon=cfg.layer_norm_eps, initializer_factor=cfg.initializer_factor,
                feed_forward_proj=proj, scale_decoder_outputs=cfg.scale_decoder_outputs,
                n_positions=cfg.max_position_embeddings)


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    proj = d.get("feed_forward_proj", "relu")
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise BertforgeError(f"feed_forward_proj {proj!r} is not 'ACT' or 'gated-ACT'")
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]  # transformers' backward-compatible spelling
    rate = d.get("dropout_rate", 0.1)
    # transformers 5 always ties the output to `shared`; the d_model**-0.5 rescale is `scale_decoder_outputs`,
    # which older files (T5 v1.1) spell tie_word_embeddings=False.
    scale = d.get("scale_decoder_outputs", d.get("tie_word_embeddings", True) is not False)
    return dict(model_type="t5", vocab_size=d["vocab_size"], d_model=d["d_model"], d_kv=d["d_kv"],
                encoder_layers=d["num_layers"], decoder_layers=d.get("num_decoder_layers") or d["num_layers"],
                encoder_attention_heads=d["num_heads"], decoder_attention_heads=d["num_heads"],
                encoder_ffn_dim=d["d_ff"], decoder_ffn_dim=d["d_ff"], activation=act, gated_ffn=len(parts) == 2,
                dropout=rate, attention_dropout=rate, activation_dropout=rate,
                layer_norm_eps=d.get("layer_norm_epsilon", 1e-6),
                relative_attention_num_buckets=d.get("relative_attention_num_buckets", 32),
                relative_attention_max_distance=d.get("relative_attention_max_distance", 128),
                max_position_embeddings=d.get("n_positions") or 512, scale_decoder_outputs=bool(scale),
                initializer_factor=d.get("initializer_factor", 1.0), pad_token_id=token_id(d, "pad_token_id", 0),
                eos_token_id=token_id(d, "eos_token_id", 1),
                decoder_start_token_id=token_id(d, "decoder_start_token_id", token_id(d, "pad_token_id", 0)))


# T5's SentencePiece layout: <pad> = 0, </s> = 1, <unk> = 2, the pieces, then 100 sentinels <extra_id_99> ...
# <extra_id_0> (so <extra_id_0> has the highest id); "</s>" ends every text and plays [CLS]'s role too. The text
# is cased and not normalised: transformers' T5Tokenizer rebuilds the pipeline without a normaliser unless given a
# SentencePiece character map, and a saved tokenizer must encode alike in both libraries.
TOKENIZER = TokenizerLayout(
    model="unigram", specials={"pad": "<pad>", "sep": "</s>", "unk": "<unk>", "cls": "</s>", "mask": None},
    frame="eos", hf_class="T5Tokenizer", special_map=(("eos_token", "sep"), ("unk_token", "unk"), ("pad_token", "pad")),
    config={"extra_ids": 100}, marker="<extra_id_0>", normalise=False, cased=True, sentinels=100)

RECIPES = (
    # Raffel et al. 2020: span corruption (15% noise in spans of mean length 3, each span one sentinel; the target
    # is the sentinels and the spans), text packed across documents, SentencePiece Unigram with 100 sentinels.
    dict(name="t5", objective="span-corruption", masking="token", dynamic=True, input_format="full-sentences",
         tokenizer_kind="t5", mask_prob=0.15, span_mean=3.0),
)

FAMILY = Family(
    "t5", "T5", "",
    stack=ENCODER_DECODER,
    head_classes={"lm": "T5ForConditionalGeneration"},
    recipes=RECIPES,
    tokenizer=TOKENIZER,
    presets={
        # Raffel et al. 2020, Table 14 (t5-small: 6 + 6 layers of 512, 8 heads of 64, d_ff 2048)
        "t5-small": ("small", dict(encoder_layers=6, decoder_layers=6)),
        "t5-base": ("base", {}),
        "t5-large": ("large", {}),
        # T5 v1.1 (gated-GELU, untied-output scale off): base is 12 + 12 x 768, 12 heads, d_ff 2048
        "t5-v1_1-base": ("base", dict(gated_ffn=True, activation="gelu_new", encoder_ffn_dim=2048,
                                      decoder_ffn_dim=2048, scale_decoder_outputs=False, dropout=0.0,
                                      attention_dropout=0.0, activation_dropout=0.0)),
    },
    checkpoint=CheckpointLayout(
        weight_rules=(  # the first match wins
            (_STACK + r"position_bias\.", r"\1.block.0.layer.0.SelfAttention."),
            (_STACK + r"layers\.(\d+)\.self_attn\.", r"\1.block.\2.layer.0.SelfAttention."),
            (_STACK + r"layers\.(\d+)\.self_attn_norm\.", r"\1.block.\2.layer.0.layer_norm."),
            (r"^decoder\.layers\.(\d+)\.cross_attn\.", r"decoder.block.\1.layer.1.EncDecAttention."),
            (r"^decoder\.layers\.(\d+)\.cross_attn_norm\.", r"decoder.block.\1.layer.1.layer_norm."),
            (r"^encoder\.layers\.(\d+)\.ffn\.", r"encoder.block.\1.layer.1.DenseReluDense."),
            (r"^encoder\.layers\.(\d+)\.ffn_norm\.", r"encoder.block.\1.layer.1.layer_norm."),
            (r"^decoder\.layers\.(\d+)\.ffn\.", r"decoder.block.\1.layer.2.DenseReluDense."),
            (r"^decoder\.layers\.(\d+)\.ffn_norm\.", r"decoder.block.\1.layer.2.layer_norm."),
            (_STACK + r"final_norm\.", r"\1.final_layer_norm."),
        )),
    schema=ConfigSchema(
        checks=checks((("num_layers",), LAYERS), (("num_decoder_layers",), SOME_LAYERS), (("num_heads",), HEADS),
                       (("d_model",), WIDTH), (("d_kv",), SOME_WIDTH), (("d_ff",), FFN), (("dropout_rate",), RATE),
                       (("layer_norm_epsilon",), EPS), (("initializer_factor",), INIT), (("n_positions",), POSITIONS),
                       (("relative_attention_num_buckets",), Field("int", 1, MAX_HEADS)),
                       (("relative_attention_max_distance",), Field("int", 1, MAX_POSITIONS)),
                       (("scale_decoder_outputs",), SWITCH), (("feed_forward_proj",), TEXT), base=BERT_CHECKS),
        # T5Config has one head count, one FFN width and one dropout rate for both stacks
        one_value_for=(("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"),
                       ("dropout", "attention_dropout"), ("dropout", "activation_dropout")),
        write_config=write_config,
        read_config=read_config,
        config_fields=frozenset({
            "model_type", "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
            "relative_attention_num_buckets", "relative_attention_max_distance", "dropout_rate", "layer_norm_epsilon",
            "initializer_factor", "feed_forward_proj", "dense_act_fn", "is_gated_act", "scale_decoder_outputs",
            "tie_word_embeddings", "n_positions", "pad_token_id", "eos_token_id", "bos_token_id",
            "decoder_start_token_id", "classifier_dropout"}),
        fixed_fields={}),  # T5's output is always tied; tie_word_embeddings only says whether to rescale
    defaults=Defaults(
        vocab_size=32128,
        pad_token_id=0,
        hidden_act="relu",
        layer_norm_eps=1e-6),
    structure=StackTraits(
        norm_position="pre",
        rms_norm=True,
        relative_positions=True,
        bias=False,
        scaled_attention=False,
        mlp=EITHER_MLP),
    seq2seq=Seq2SeqTraits(
        own_head_width=True,
        init=FAN_IN_INIT,
        rescales_output=True,
        eos_token_id=1),
    verbs=VerbDefaults(
        finetune_lr=1e-4))
