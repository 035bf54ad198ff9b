"""One forward pass: the inference copy (fused Q/K/V, fp32 / bf16 / int8) against Encoder.forward; one attention
implementation; the shared mean pooling, loss helper and sequence classifier."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.model.heads import mean_pool, task_loss
from bertforge.model import Encoder, FusedSelfAttention, Int8Linear, SelfAttention, for_inference

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)
CONFIGS = {
    "bert": ModelConfig(**SMALL),
    "roberta": ModelConfig(model_type="roberta", pad_token_id=1, type_vocab_size=1, use_pooler=False, **SMALL),
    "albert-shared": ModelConfig(model_type="albert", embedding_size=16, share_layers="all", hidden_act="gelu_new",
                                 **SMALL),
}


def _model(cfg: ModelConfig) -> Encoder:
    torch.manual_seed(0)
    enc = Encoder(cfg).eval()
    with torch.no_grad():  # non-trivial biases and LayerNorms, so a path that drops one cannot pass
        for p in enc.parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape) * 0.1)
    return enc


def _padded_batch(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, cfg.vocab_size, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    mask[3, 4:] = 0
    ids[mask == 0] = cfg.pad_token_id
    return ids, mask


def _token_cosine(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a[real].float(), b[real].float(), dim=-1)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_inference_copy_matches_encoder_forward(name):
    cfg = CONFIGS[name]
    enc = _model(cfg)
    ids, mask = _padded_batch(cfg)
    real = mask.bool()
    with torch.inference_mode():
        want = enc(ids, mask).last_hidden_state
        fp32 = for_inference(enc, "fp32")(ids, mask)
        bf16 = for_inference(enc, "bf16")(ids, mask).last_hidden_state
        int8 = for_inference(enc, "int8")(ids, mask).last_hidden_state
        unpadded = for_inference(enc, "fp32")(ids[:1]).last_hidden_state
    torch.testing.assert_close(fp32.last_hidden_state[real], want[real], atol=1e-5, rtol=0)
    if enc.pooler is not None:
        torch.testing.assert_close(fp32.pooler_output, enc(ids, mask).pooler_output, atol=1e-5, rtol=0)
    torch.testing.assert_close(unpadded, enc(ids[:1]).last_hidden_state, atol=1e-5, rtol=0)
    # bf16 keeps ~3 significant digits: hidden states (LayerNorm outputs, O(1)) agree to a few hundredths
    assert bf16.dtype == torch.bfloat16
    assert (bf16.float() - want)[real].abs().max() < 0.1
    assert _token_cosine(bf16, want, real).min() > 0.999
    assert _token_cosine(int8, want, real).min() > 0.98


def test_inference_copy_structure():
    cfg = CONFIGS["albert-shared"]
    enc = _model(cfg)
    fast = for_inference(enc, "fp32")
    layers = fast.encoder.layer
    assert all(isinstance(layer.attention.self, FusedSelfAttention) for layer in layers)
    assert layers[2].attention.self is layers[0].attention.self  # ALBERT's sharing survives, fused once
    assert isinstance(enc.encoder.layer[0].attention.self, SelfAttention)  # the source is untouched
    assert not any(p.requires_grad for p in fast.parameters()) and not fast.training
    assert all(p.data_ptr() != q.data_ptr() for p in fast.parameters() for q in enc.parameters())
    q8 = for_inference(enc, "int8")
    fp32_linear = {name for name, m in q8.named_modules(remove_duplicate=False) if type(m) is torch.nn.Linear}
    assert fp32_linear == set()  # every Linear is int8 (shared layers too)
    assert q8.encoder.layer[2].attention.self.qkv.weight().dtype == torch.qint8
    assert type(q8.encoder.layer[0].output.dense) is Int8Linear and type(q8.pooler.dense) is Int8Linear
    # scheme 1 (folders quantised before scheme 2) kept the FFN output projections fp32
    q1 = for_inference(enc, "int8", int8_scheme=1)
    fp32_linear = {name for name, m in q1.named_modules(remove_duplicate=False) if type(m) is torch.nn.Linear}
    assert fp32_linear == {f"encoder.layer.{i}.output.dense" for i in range(3)}
    with pytest.raises(BertforgeError, match="inference copy"):
        fast.save_pretrained("/nonexistent")
    with pytest.raises(BertforgeError, match="precision"):
        for_inference(enc, "fp8")


def test_eager_implementation_matches_sdpa():
    cfg = CONFIGS["bert"]
    sdpa = _model(cfg)
    eager = Encoder(cfg, attn_implementation="eager").eval()
    eager.load_state_dict(sdpa.state_dict())
    ids, mask = _padded_batch(cfg)
    real = mask.bool()
    with torch.no_grad():
        a, b = sdpa(ids, mask).last_hidden_state, eager(ids, mask).last_hidden_state
    torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=0)
    with pytest.raises(BertforgeError, match="attn_implementation"):
        Encoder(cfg, attn_implementation="flash")


def test_one_attention_implementation_and_no_second_forward_pass():
    """Only model/attention.py calls scaled_dot_product_attention (once, in `attend`)."""
    calls: dict[str, int] = {}
    for path in SRC.rglob("*.py"):
        n = len(re.findall(r"scaled_dot_product_attention\(", path.read_text(encoding="utf-8")))
        if n:
            calls[str(path.relative_to(SRC))] = n
    assert calls == {"model/attention.py": 1}
    assert not (SRC / "embed" / "fast.py").exists()


def test_mean_pool_hand_worked():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                           [[2.0, 0.0], [4.0, 2.0], [6.0, 4.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    torch.testing.assert_close(mean_pool(hidden, mask), torch.tensor([[2.0, 3.0], [4.0, 2.0]]))
    torch.testing.assert_close(mean_pool(hidden[1:], None), torch.tensor([[4.0, 2.0]]))
    # a row with no real token gives zeros (count clamped at 1e-9, as sentence-transformers does), not NaN
    torch.testing.assert_close(mean_pool(hidden[:1], torch.zeros(1, 3)), torch.zeros(1, 2))


def test_task_loss_hand_worked():
    # regression: MSE of the squeezed logits, in fp32 even for bf16 logits
    reg = task_loss(torch.tensor([[1.0], [3.0]], dtype=torch.bfloat16), torch.tensor([0.0, 1.0]), regression=True)
    assert reg.dtype == torch.float32 and abs(float(reg) - (1 + 4) / 2) < 1e-6
    # classification: two classes, logits [0, ln 3] -> p(class 1) = 3/4
    logits = torch.tensor([[0.0, float(torch.tensor(3.0).log())]])
    assert abs(float(task_loss(logits, torch.tensor([1]))) + float(torch.tensor(0.75).log())) < 1e-6
    # token logits [B, T, C]: labels of -100 are ignored
    tok = torch.zeros(1, 3, 4)
    tok[0, 0, 2] = 5.0
    loss = task_loss(tok, torch.tensor([[2, -100, -100]]))
    want = -torch.log_softmax(torch.tensor([0.0, 0.0, 5.0, 0.0]), 0)[2]
    assert abs(float(loss) - float(want)) < 1e-6


def test_cross_encoder_is_the_sequence_classifier():
    from bertforge.embedding.cross_encoder import CrossEncoder
    from bertforge.tasks.models import SequenceClassifier

    cfg = CONFIGS["bert"]
    torch.manual_seed(0)
    ce = CrossEncoder(cfg)
    assert isinstance(ce, SequenceClassifier) and ce.kind == "regress" and ce.architecture == \
        "BertForSequenceClassification"
    assert CrossEncoder(cfg, num_labels=3).kind == "classify"
    roberta = CrossEncoder(CONFIGS["roberta"].replace(use_pooler=True))
    assert roberta.bert.pooler is None  # HF's RoBERTa classifier has no pooler: same rule as fine-tuning
    ids, mask = _padded_batch(cfg)
    out = ce.eval()(ids, mask, labels=torch.tensor([0.5, 1.0, 0.0, 2.0]))
    torch.testing.assert_close(out["loss"], F.mse_loss(out["logits"].squeeze(-1), torch.tensor([0.5, 1.0, 0.0, 2.0])))


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_rows_equal_separate_sequences(impl):
    """Two sequences packed into one row with `segment_mask` and restarted positions give the same token vectors
    as each sequence run on its own; the padding after them changes nothing."""
    from bertforge.model import segment_mask
    cfg = CONFIGS["bert"]
    enc = _model(cfg)
    for layer in enc.encoder.layer:
        layer.attention.self.attn_implementation = impl
    torch.manual_seed(1)
    a, b = torch.randint(5, cfg.vocab_size, (1, 7)), torch.randint(5, cfg.vocab_size, (1, 5))
    row = torch.cat([a, b, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    segments = torch.tensor([[1] * 7 + [2] * 5 + [0] * 3])
    positions = torch.tensor([list(range(7)) + list(range(5)) + [0, 0, 0]])
    with torch.no_grad():
        packed = enc(row, attention_mask=segment_mask(segments), position_ids=positions).last_hidden_state
        alone_a, alone_b = enc(a).last_hidden_state, enc(b).last_hidden_state
    torch.testing.assert_close(packed[:, :7], alone_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[:, 7:12], alone_b, atol=1e-5, rtol=0)
    assert torch.isfinite(packed).all()
