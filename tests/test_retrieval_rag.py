"""RAG's marginalisation against transformers' RagTokenForGeneration / RagSequenceForGeneration: the same generator
weights (BART and T5, random, fp32), the same `context_input_ids` and `doc_scores`, the same loss and logits."""
from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

from bertforge.errors import BertforgeError
from bertforge.model import Seq2SeqLM
from bertforge.retrieval.rag import RetrievalAugmentedGenerator, marginalise_tokens, rag_token_nll

transformers.logging.set_verbosity_error()
V, K, B = 53, 3, 2


def hf_generator(kind: str):
    torch.manual_seed(0)
    if kind == "t5":
        cfg = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=40, num_layers=2, num_decoder_layers=2,
                                    num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                                    tie_word_embeddings=False,
                                    initializer_factor=1.0)
        model = transformers.T5ForConditionalGeneration(cfg).eval()
        with torch.no_grad():  # wide output weights, so that decoding goes somewhere other than the pad token
            model.lm_head.weight.normal_(0, 3.0)
            model.lm_head.weight[0] = 0.0  # the pad token never wins
        return model
    cfg = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=40,
                                  decoder_ffn_dim=24, max_position_embeddings=40, init_std=0.3)
    model = transformers.BartForConditionalGeneration(cfg).eval()
    model.final_logits_bias.normal_(0, 0.5)  # transformers starts it at zero; a random one checks it is added
    model.final_logits_bias[0, cfg.eos_token_id] = -5.0  # answers longer than one token, for the decoding tests
    return model


def hf_rag(kind: str, marginalise: str, generator):
    q = transformers.DPRConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=20)
    cfg = transformers.RagConfig.from_question_encoder_generator_configs(q, generator.config, n_docs=K)
    cls = transformers.RagTokenForGeneration if marginalise == "token" else transformers.RagSequenceForGeneration
    return cls(config=cfg, question_encoder=transformers.DPRQuestionEncoder(q), generator=generator).eval()


@pytest.fixture(scope="module", params=["bart", "t5"])
def generators(request, tmp_path_factory):
    hf = hf_generator(request.param)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, hf, Seq2SeqLM.from_pretrained(path)


def inputs(pad: int, bos: int | None):
    g = torch.Generator().manual_seed(3)
    ctx = torch.randint(3, V, (B * K, 9), generator=g)
    mask = torch.ones_like(ctx)
    mask[1, 6:], mask[4, 3:] = 0, 0
    ctx = ctx.masked_fill(mask == 0, pad)
    labels = torch.randint(3, V, (B, 6), generator=g)
    if bos is not None:
        labels[:, 0] = bos
    labels[1, 4:] = pad  # a shorter answer: padding never scores
    scores = torch.randn(B, K, generator=g) * 2
    return ctx, mask, labels, scores


@pytest.mark.parametrize("marginalise", ["token", "sequence"])
def test_loss_and_logits_equal_transformers(generators, marginalise):
    kind, hf, ours = generators
    ref = hf_rag(kind, marginalise, hf)
    cfg = hf.config
    ctx, mask, labels, scores = inputs(cfg.pad_token_id, cfg.bos_token_id if kind == "bart" else None)
    model = RetrievalAugmentedGenerator(ours, n_docs=K, marginalise=marginalise)
    with torch.no_grad():
        want = ref(context_input_ids=ctx, context_attention_mask=mask, doc_scores=scores, labels=labels, n_docs=K)
        got = model(ctx, mask, scores, labels=labels)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    if marginalise == "token":
        with torch.no_grad():
            marg = ref(context_input_ids=ctx, context_attention_mask=mask, doc_scores=scores, labels=labels,
                       n_docs=K, do_marginalize=True).logits
        torch.testing.assert_close(got.marginalised(), marg, atol=1e-5, rtol=1e-5)


def test_sequence_rescoring_without_the_start_token_equals_transformers(generators):
    kind, hf, ours = generators
    if kind != "bart":
        pytest.skip("exclude_bos_score applies where answers start with a bos token")
    ref = hf_rag(kind, "sequence", hf)
    ctx, mask, labels, scores = inputs(hf.config.pad_token_id, hf.config.bos_token_id)
    model = RetrievalAugmentedGenerator(ours, n_docs=K, marginalise="sequence")
    with torch.no_grad():
        want = ref(context_input_ids=ctx, context_attention_mask=mask, doc_scores=scores, labels=labels, n_docs=K,
                   exclude_bos_score=True, reduce_loss=True)
        got = model(ctx, mask, scores, labels=labels, exclude_bos_score=True, reduce=True)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-5)


def test_token_marginalisation_by_hand():
    """Two passages with priors 0.75 / 0.25 and next-token distributions [0.5, 0.5] / [1, 0] (as logits):
    RAG-Token's distribution is 0.75 * [0.5, 0.5] + 0.25 * [1, 0] = [0.625, 0.375]."""
    logits = torch.log(torch.tensor([[[0.5, 0.5]], [[1.0, 1e-30]]]))
    scores = torch.log(torch.tensor([[0.75, 0.25]]))
    probs = marginalise_tokens(logits, scores, 2).exp()
    torch.testing.assert_close(probs, torch.tensor([[[0.625, 0.375]]]))
    # labels [start, 1]: the target after the start token is token 1, -log 0.375; the padding (token 0) that the
    # shift appends after it never scores
    nll = rag_token_nll(torch.cat([logits, logits], 1), scores, torch.tensor([[0, 1]]), n_docs=2, pad_token_id=0)
    torch.testing.assert_close(nll, -torch.log(torch.tensor([0.375])))


def test_a_loss_that_falls_trains_the_generator_through_the_passages(generators):
    kind, _, ours = generators
    ours = copy.deepcopy(ours)  # the fixture's weights stay those of transformers' model for the other tests
    model = RetrievalAugmentedGenerator(ours, n_docs=K, marginalise="token")
    cfg = ours.config
    ctx, mask, labels, scores = inputs(cfg.pad_token_id, cfg.bos_token_id if kind == "bart" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for _ in range(8):
        loss = model(ctx, mask, scores, labels=labels, reduce=True).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    assert losses[-1] < 0.7 * losses[0], losses


def test_bad_shapes_are_one_line(generators):
    _, _, ours = generators
    with pytest.raises(BertforgeError, match="n_docs"):
        RetrievalAugmentedGenerator(ours, n_docs=0)
    with pytest.raises(BertforgeError, match="marginalise"):
        RetrievalAugmentedGenerator(ours, marginalise="passage")
    model = RetrievalAugmentedGenerator(ours, n_docs=K)
    ctx, mask, labels, scores = inputs(ours.config.pad_token_id, None)
    with pytest.raises(BertforgeError, match="doc_scores"):
        model(ctx, mask, scores[:, :2], labels=labels)


@pytest.mark.parametrize("beams", [1, 3])
def test_rag_token_decoding_equals_transformers(generators, beams):
    from bertforge.retrieval.rag import generate_token_marginal

    kind, hf, ours = generators
    ref = hf_rag(kind, "token", hf)
    cfg = hf.config
    ctx, mask, _, scores = inputs(cfg.pad_token_id, None)
    with torch.no_grad():
        want = ref.generate(context_input_ids=ctx, context_attention_mask=mask, doc_scores=scores, n_docs=K,
                            num_beams=beams, max_length=8, do_sample=False)
    got = generate_token_marginal(ours, ctx, mask, scores, max_new_tokens=7, greedy=beams == 1, num_beams=beams)
    assert got.tolist() == want.tolist()
    assert len(set(want[:, 1:].flatten().tolist())) >= 2, "a decoding test needs answers that go somewhere"


@pytest.mark.parametrize("beams", [1, 3])
def test_rag_sequence_thorough_decoding_equals_transformers(generators, beams):
    """Contexts without padding: transformers' per-passage beam search drops the attention mask (see the
    function's docstring), which only matters where a context is padded."""
    from bertforge.retrieval.rag import generate_sequence_marginal

    kind, hf, ours = generators
    ref = hf_rag(kind, "sequence", hf)
    ctx, _, _, scores = inputs(hf.config.pad_token_id, None)
    ctx = ctx.masked_fill(ctx == hf.config.pad_token_id, 5)
    mask = torch.ones_like(ctx)
    with torch.no_grad():
        want = ref.generate(context_input_ids=ctx, context_attention_mask=mask, doc_scores=scores, n_docs=K,
                            num_beams=beams, max_length=7, do_sample=False)
    got = generate_sequence_marginal(ours, ctx, mask, scores, num_beams=beams, max_new_tokens=6)
    for q in range(B):
        assert got[q].tolist() == want[q, :len(got[q])].tolist()
        assert (want[q, len(got[q]):] == hf.config.pad_token_id).all()


def test_fast_decoding_scores_a_candidate_only_on_its_own_passages(generators):
    from bertforge.retrieval.rag import generate_sequence_marginal

    kind, hf, ours = generators
    ctx, mask, _, scores = inputs(hf.config.pad_token_id, None)
    fast = generate_sequence_marginal(ours, ctx, mask, scores, num_beams=2, max_new_tokens=5, decoding="fast")
    thorough = generate_sequence_marginal(ours, ctx, mask, scores, num_beams=2, max_new_tokens=5)
    assert len(fast) == len(thorough) == B
    # with one passage the two coincide: every candidate came from it
    one = scores[:, :1]
    rows = torch.arange(0, B * K, K)
    f1 = generate_sequence_marginal(ours, ctx[rows], mask[rows], one, num_beams=2, max_new_tokens=5, decoding="fast")
    t1 = generate_sequence_marginal(ours, ctx[rows], mask[rows], one, num_beams=2, max_new_tokens=5)
    assert [a.tolist() for a in f1] == [a.tolist() for a in t1]
    with pytest.raises(BertforgeError, match="decoding"):
        generate_sequence_marginal(ours, ctx, mask, scores, decoding="quick")


# ---- checkpoints in transformers' RAG layout ------------------------------------------------------------------
def test_a_transformers_rag_folder_loads_with_the_same_loss(generators, tmp_path):
    from bertforge.retrieval.rag_folder import load_generator, open_rag_folder

    kind, hf, _ = generators
    ref = hf_rag(kind, "token", hf)
    ref.save_pretrained(tmp_path)
    folder = open_rag_folder(tmp_path)
    assert folder.n_docs == K
    model = RetrievalAugmentedGenerator(load_generator(folder), n_docs=folder.n_docs)
    ctx, mask, labels, scores = inputs(hf.config.pad_token_id, None)
    with torch.no_grad():
        want = ref(context_input_ids=ctx, context_attention_mask=mask, doc_scores=scores, labels=labels).loss
        got = model(ctx, mask, scores, labels=labels).loss
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_an_assembled_rag_folder_loads_in_transformers_unchanged(generators, tmp_path):
    from bertforge.retrieval.rag_folder import save_rag_folder

    kind, hf, ours = generators
    q = transformers.DPRQuestionEncoder(transformers.DPRConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1,
                                                               num_attention_heads=2, intermediate_size=20)).eval()
    q.save_pretrained(tmp_path / "q")
    ours.save_pretrained(tmp_path / "g")  # bertforge's own save of the generator
    save_rag_folder(tmp_path / "rag", tmp_path / "q", tmp_path / "g", settings={"n_docs": K})
    cls = transformers.RagSequenceForGeneration
    loaded, info = cls.from_pretrained(tmp_path / "rag", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ctx, mask, labels, scores = inputs(hf.config.pad_token_id, None)
    with torch.no_grad():
        want = loaded.eval()(context_input_ids=ctx, context_attention_mask=mask, doc_scores=scores,
                             labels=labels).loss
        got = RetrievalAugmentedGenerator(ours, n_docs=K, marginalise="sequence")(ctx, mask, scores,
                                                                                 labels=labels).loss
        qv = loaded.question_encoder(torch.tensor([[5, 6, 7]])).pooler_output
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(qv, q(torch.tensor([[5, 6, 7]])).pooler_output, atol=1e-6, rtol=1e-6)


def test_a_rag_folder_missing_its_generator_is_one_line(generators, tmp_path):
    from safetensors.torch import load_file, save_file

    from bertforge.retrieval.rag_folder import open_rag_folder

    kind, hf, _ = generators
    hf_rag(kind, "token", hf).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in state.items() if not k.startswith("rag.generator.")}, tmp_path / "model.safetensors")
    with pytest.raises(BertforgeError, match="no generator weights"):
        open_rag_folder(tmp_path)
