"""BART (Lewis et al. 2020): GPT-2's byte-level BPE (50265) with <s>=0 <pad>=1 </s>=2 (the decoder starts from
</s>), 1024 learned positions (offset 2), GELU, LayerNorm after each sub-block (eps 1e-5, nn.LayerNorm's default),
biases everywhere, scaled attention scores. Its config.json is `BartConfig`'s; its tensor names are rewritten by
every rule in turn (`q` -> `q_proj`, `cross_attn` -> `encoder_attn`, ...)."""
from typing import Any

from bertforge.families.family import (ENCODER_DECODER, CheckpointLayout, ConfigSchema, Defaults, Family, Seq2SeqTraits,
                                       token_id)
from bertforge.families.record.schema import BERT_CHECKS, FFN, HEADS, INIT, LAYERS, RATE, SWITCH, TEXT, WIDTH, checks


def write_config(cfg: Any) -> dict[str, Any]:
    return dict(model_type="bart", vocab_size=cfg.vocab_size, d_model=cfg.d_model,
                max_position_embeddings=cfg.max_position_embeddings, encoder_layers=cfg.encoder_layers,
                decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.encoder_attention_heads,
                decoder_attention_heads=cfg.decoder_attention_heads, encoder_ffn_dim=cfg.encoder_ffn_dim,
                decoder_ffn_dim=cfg.decoder_ffn_dim, activation_function=cfg.activation, dropout=cfg.dropout,
                attention_dropout=cfg.attention_dropout, activation_dropout=cfg.activation_dropout,
                init_std=cfg.initializer_range, scale_embedding=cfg.scale_embedding, encoder_layerdrop=0.0,
                decoder_layerdrop=0.0, bos_token_id=cfg.bos_token_id, forced_bos_token_id=cfg.forced_bos_token_id,
                forced_eos_token_id=cfg.forced_eos_token_id)


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    d_model = d.get("d_model", 1024)
    return dict(model_type="bart", vocab_size=d["vocab_size"], d_model=d_model,
                encoder_layers=d.get("encoder_layers", 12), decoder_layers=d.get("decoder_layers", 12),
                encoder_attention_heads=d.get("encoder_attention_heads", 16),
                decoder_attention_heads=d.get("decoder_attention_heads", 16),
                d_kv=d_model // d.get("encoder_attention_heads", 16),
                encoder_ffn_dim=d.get("encoder_ffn_dim", 4096), decoder_ffn_dim=d.get("decoder_ffn_dim", 4096),
                activation=d.get("activation_function", "gelu"), dropout=d.get("dropout", 0.1),
                attention_dropout=d.get("attention_dropout", 0.0),
                activation_dropout=d.get("activation_dropout", 0.0), layer_norm_eps=1e-5,
                max_position_embeddings=d.get("max_position_embeddings", 1024),
                scale_embedding=bool(d.get("scale_embedding", False)), initializer_range=d.get("init_std", 0.02),
                pad_token_id=token_id(d, "pad_token_id", 1), eos_token_id=token_id(d, "eos_token_id", 2),
                bos_token_id=d.get("bos_token_id", 0),
                decoder_start_token_id=token_id(d, "decoder_start_token_id", 2),
                forced_bos_token_id=d.get("forced_bos_token_id"),
                forced_eos_token_id=d.get("forced_eos_token_id", 2))


RECIPES = (
    # Lewis et al. 2020: text infilling (30% of the tokens in Poisson(3) spans, each span one <mask>) after
    # sentence permutation, the target the original text; GPT-2's byte-level BPE with RoBERTa's specials.
    dict(name="bart", objective="denoising", masking="token", dynamic=True, input_format="doc-sentences",
         tokenizer_kind="bpe", mask_prob=0.3, span_mean=3.0),
)


FAMILY = Family(
    "bart", "Bart", "model",
    stack=ENCODER_DECODER,
    head_classes={"lm": "BartForConditionalGeneration"},
    recipes=RECIPES,
    # Lewis et al. 2020: bart-base 6 + 6 x 768 (12 heads, FFN 3072), bart-large 12 + 12 x 1024 (16, 4096)
    presets={"bart-base": ("base", dict(encoder_layers=6, decoder_layers=6)),
             "bart-large": ("large", dict(encoder_layers=12, decoder_layers=12))},
    checkpoint=CheckpointLayout(
        weight_rules=(  # every rule in turn
            (r"^shared\.", "model.shared."),
            (r"\.(self_attn|cross_attn)\.([qkv])\.", r".\1.\2_proj."),
            (r"\.(self_attn|cross_attn)\.o\.", r".\1.out_proj."),
            (r"\.cross_attn", ".encoder_attn"),
            (r"\.self_attn_norm\.", ".self_attn_layer_norm."),
            (r"\.encoder_attn_norm\.", ".encoder_attn_layer_norm."),
            (r"\.ffn\.wi\.", ".fc1."),
            (r"\.ffn\.wo\.", ".fc2."),
            (r"\.ffn_norm\.", ".final_layer_norm."),
            (r"^(encoder|decoder)\.", r"model.\1."),
        ),
        first_rule_only=False),
    schema=ConfigSchema(
        checks=checks((("encoder_layers", "decoder_layers"), LAYERS),
                       (("encoder_attention_heads", "decoder_attention_heads"), HEADS), (("d_model",), WIDTH),
                       (("encoder_ffn_dim", "decoder_ffn_dim"), FFN),
                       (("dropout", "attention_dropout", "activation_dropout"), RATE), (("init_std",), INIT),
                       (("scale_embedding",), SWITCH), (("activation_function",), TEXT), base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config,
        config_fields=frozenset({
            "model_type", "vocab_size", "d_model", "max_position_embeddings", "encoder_layers", "decoder_layers",
            "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
            "activation_function", "dropout", "attention_dropout", "activation_dropout", "init_std", "scale_embedding",
            "encoder_layerdrop", "decoder_layerdrop", "bos_token_id", "eos_token_id", "pad_token_id",
            "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id", "classifier_dropout",
            "tie_word_embeddings", "num_hidden_layers",
            # fairseq-era fields of the published BART configs, accepted at BART's values (fixed_fields)
            "normalize_before", "add_final_layer_norm", "normalize_embedding", "static_position_embeddings",
            "add_bias_logits", "extra_pos_embeddings"}),
        fixed_fields={"encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "tie_word_embeddings": True,
                      "normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": True,
                      "static_position_embeddings": False, "add_bias_logits": False, "extra_pos_embeddings": 2}),
    defaults=Defaults(
        vocab_size=50265,
        pad_token_id=1,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        max_position_embeddings=1024),
    seq2seq=Seq2SeqTraits(
        position_offset=2,
        eos_token_id=2,
        bos_token_id=0,
        decoder_starts_with="eos",
        prompt_starts_with_bos=True,
        forces_eos=True,
        final_logits_bias=True,
        embedding_padding_idx=True,
        sublayer_dropout=0.0))
