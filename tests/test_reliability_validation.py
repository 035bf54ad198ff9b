"""Reliability (issue #33, validation): nonsense input is one line naming the flag / file / field, before any work.

The CLI cases run the installed console script (`cli`, `one_line` from tests/test_reliability.py); the table of
numeric flags walks the parsers bertforge.cli builds, so a verb or flag added later is covered without a new test.
"""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from bertforge import cli as bertforge_cli
from bertforge.commands.bounds import Number
from test_reliability import cli, one_line


# ---- every numeric flag of every verb --------------------------------------------------------------------------
def _verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(argv prefix, parser) for every verb and sub-verb."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _verbs(sub, (*path, name))


def _numeric_flags():
    for path, parser in _verbs(bertforge_cli.build_parser()):
        for action in parser._actions:
            if action.option_strings and (action.type in (int, float) or isinstance(action.type, Number)):
                yield path, action


NUMERIC = [(path, action) for path, action in _numeric_flags()]


def test_every_numeric_flag_declares_its_bounds():
    assert len(NUMERIC) > 100  # the walk reaches every verb (finetune, index build, analyze heads, ...)
    unbounded = [f"{' '.join(path)} {action.option_strings[0]}" for path, action in NUMERIC
                 if not isinstance(action.type, Number)]
    assert unbounded == [], f"declare a bound (bertforge.commands.bounds) for: {unbounded}"


@pytest.mark.parametrize("path,action", NUMERIC, ids=[f"{' '.join(p)} {a.option_strings[0]}" for p, a in NUMERIC])
def test_bad_values_of_a_numeric_flag_are_one_line_naming_it(path, action, capsys):
    flag = action.option_strings[0]
    for bad in action.type.bad_values():
        # parse-only: argparse refuses the value before the verb runs (main returns the status)
        assert bertforge_cli.main([*path, f"{flag}={bad}"]) == 2, (flag, bad)
        err = capsys.readouterr().err.strip().splitlines()
        head = f"bertforge {' '.join(path)}: error: {flag} must be "
        assert len(err) == 1 and err[0].startswith(head) and bad in err[0], (flag, bad, err)
    # the declared default lies within the bound, and a value inside it is taken as a number
    if action.default is not None:
        assert action.type(str(action.default)) == action.default, (flag, action.default)
    assert isinstance(action.type(action.type.good_value()), (int, float))


def test_the_named_nonsense_of_the_issue_is_refused_by_the_console_script():
    one_line(cli("pretrain", "--eval-batches", "0"), "pretrain: error: --eval-batches must be at least 1 (got 0)")
    one_line(cli("finetune", "--lr", "nan"), "--lr must be a finite number > 0 (got nan)")
    one_line(cli("export", "--opset", "1"), "--opset must be in 14..20 (got 1)")
    # the rest of the issue's list (prune --max-examples 0, embed-train --max-steps 0, tokenizer train
    # --min-frequency -1, analyze heads --max-sentences 0) is in the in-process walk above


# ---- model folders: config.json against the weights, the tokenizer against the embedding ------------------------
def _tiny_model(root, layers: int = 2, vocab_lines: int = 100):
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.tokenization import Tokenizer

    words = [f"the cat sat on the mat number {i} and the dog ran w{i}" for i in range(vocab_lines)]
    tok = Tokenizer.train(words, kind="wordpiece", vocab_size=60 + vocab_lines, min_frequency=1)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    save_pretrained(Encoder(cfg), root, cfg, tokenizer=tok)
    return root


@pytest.fixture(scope="module")
def two_layers(tmp_path_factory):
    return _tiny_model(tmp_path_factory.mktemp("two") / "model")


def _with_config(src, dst, **fields):
    import shutil
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(fields)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("fields,message", [
    (dict(num_hidden_layers=1), "num_hidden_layers is 1 but model.safetensors holds 2 layers (encoder.layer.0 .. "),
    (dict(num_hidden_layers=3), "num_hidden_layers is 3 but model.safetensors holds 2 layers"),
    (dict(num_hidden_layers=100_000), "num_hidden_layers must be in 1..1024 (got 100000)"),  # config.checks
    (dict(num_hidden_layers=-2), "num_hidden_layers must be in 1..1024 (got -2)"),
    (dict(hidden_size=65536, num_attention_heads=2), "hidden_size is 65536 but model.safetensors holds width 32"),
    (dict(vocab_size=10**10), "vocab_size must be in 1..16777216 (got 10000000000)"),
    (dict(vocab_size=10**6), "vocab_size is 1000000 but model.safetensors holds "),
    (dict(max_position_embeddings=10**9), "max_position_embeddings must be in 1..1048576 (got 1000000000)"),
    (dict(max_position_embeddings=4096), "max_position_embeddings is 4096 but model.safetensors holds 64 "),
    (dict(intermediate_size=10**9), "intermediate_size must be in 1..262144 (got 1000000000)"),
    (dict(intermediate_size=200_000), "intermediate_size is 200000 but model.safetensors holds no tensor"),
])
def test_a_config_the_weights_do_not_have_is_refused_before_any_model_is_built(two_layers, tmp_path, monkeypatch,
                                                                                fields, message):
    from bertforge.errors import BertforgeError
    from bertforge.model import Encoder
    from bertforge.model import encoder as encoder_module

    bad = _with_config(two_layers, tmp_path / "bad", **fields)

    def allocated(*args, **kwargs):
        raise AssertionError("the model was built before config.json was checked against the weights")

    monkeypatch.setattr(encoder_module.Encoder, "__init__", allocated)
    with pytest.raises(BertforgeError) as err:
        Encoder.from_pretrained(bad)
    assert str(err.value).startswith(f"{bad / 'config.json'}: ") and message in str(err.value), str(err.value)


def test_the_console_script_refuses_a_config_with_fewer_layers_than_the_weights(two_layers, tmp_path):
    bad = _with_config(two_layers, tmp_path / "bad", num_hidden_layers=1)
    (tmp_path / "in.txt").write_text("the cat\n")
    one_line(cli("embed", "--model", str(bad), "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / "v.npy")),
             "num_hidden_layers is 1 but model.safetensors holds 2 layers")
    assert not (tmp_path / "v.npy").exists()


def test_another_models_tokenizer_in_a_model_folder_is_one_line_at_load(two_layers, tmp_path):
    import shutil

    from bertforge.errors import BertforgeError
    from bertforge.tokenization import Tokenizer

    big = _tiny_model(tmp_path / "big", layers=1, vocab_lines=400)  # a larger vocabulary than two_layers' embedding
    mixed = tmp_path / "mixed"
    shutil.copytree(two_layers, mixed)
    shutil.copy(big / "tokenizer.json", mixed / "tokenizer.json")
    vocab = json.loads((two_layers / "config.json").read_text())["vocab_size"]
    with pytest.raises(BertforgeError, match=f"but config.json's vocab_size is {vocab}: the tokenizer belongs to "):
        Tokenizer.from_pretrained(mixed)
    assert Tokenizer.from_pretrained(two_layers).vocab_size == vocab  # its own tokenizer still loads
    (tmp_path / "in.txt").write_text("the cat w399\n")
    one_line(cli("embed", "--model", str(mixed), "--input", str(tmp_path / "in.txt"), "--out",
                 str(tmp_path / "v.npy")), "the tokenizer belongs to another model")


# ---- data: non-finite scores, CoNLL tags and lengths -------------------------------------------------------------
STS_HEADER = "sentence1\tsentence2\tscore\n"


def _sts(path, scores):
    path.write_text(STS_HEADER + "".join(f"a cat number {i}\tthe dog {i}\t{s}\n" for i, s in enumerate(scores)))
    return path


@pytest.mark.parametrize("bad", ["nan", "inf", "-Infinity"])
def test_a_non_finite_score_names_the_file_and_line_in_every_reader(tmp_path, bad):
    from bertforge.embedding.data import read_examples
    from bertforge.errors import BertforgeError
    from bertforge.tasks.glue import read_stsb
    from bertforge.tasks.table import read_table

    f = _sts(tmp_path / "sts.tsv", ["1.0", "2.5", bad, "4"])
    with pytest.raises(BertforgeError, match=f"sts.tsv:4: the score '{bad}' is not a finite number"):
        read_examples(f)  # embed-train / embed-eval --sts
    with pytest.raises(BertforgeError, match=f"sts.tsv:4: the score '{bad}' is not a finite number"):
        read_stsb(f)  # finetune --task stsb on a GLUE folder
    with pytest.raises(BertforgeError, match=f"sts.tsv:4: the score '{bad}' is not a finite number"):
        read_table(f, "sentence1", "sentence2", "score", regression=True)  # finetune --task regress FILE
    (tmp_path / "sts.jsonl").write_text('{"sentence1": "a", "sentence2": "b", "score": 1}\n'
                                        '{"sentence1": "a", "sentence2": "b", "score": NaN}\n')
    with pytest.raises(BertforgeError, match=r"sts.jsonl:2: the score nan is not a finite number"):
        read_examples(tmp_path / "sts.jsonl")
    assert [e.label for e in read_examples(_sts(tmp_path / "ok.tsv", ["1", "2.5"])).examples] == [1.0, 2.5]


def test_a_nan_gold_score_is_one_line_from_the_console_script(two_layers, tmp_path):
    sts = _sts(tmp_path / "sts.tsv", ["1.0", "nan", "3"])
    one_line(cli("embed-eval", "--model", str(two_layers), "--sts", str(sts)), "sts.tsv:3: the score 'nan'")
    train = _sts(tmp_path / "train.tsv", ["1.0", "2.0", "3.0", "4.0"])
    one_line(cli("finetune", "--model", str(two_layers), "--task", "stsb", "--train", str(train), "--eval", str(sts),
                 "--text-col", "sentence1", "--text-pair-col", "sentence2", "--label-col", "score",
                 "--out", str(tmp_path / "ft")), "sts.tsv:3: the score 'nan' is not a finite number")
    assert not (tmp_path / "ft").exists()


def _conll(path, sentences):
    path.write_text("".join("".join(f"{w} NN O {t}\n" for w, t in s) + "\n" for s in sentences))
    return path


def test_conll_tags_outside_the_iob_scheme_are_refused_and_a_lone_entity_type_is_warned(tmp_path):
    import warnings as warnings_module

    from bertforge.errors import BertforgeError
    from bertforge.tasks.conll import read_conll

    ok = [[("Anna", "B-PER"), ("went", "O")], [("to", "O"), ("Rome", "B-LOC")]]
    bad = _conll(tmp_path / "bad.txt", [*ok, [("x", "O"), ("Bob", "BPER")]])
    with pytest.raises(BertforgeError, match=r"bad.txt:8: tag 'BPER' is not an IOB tag"):
        read_conll(bad)
    many = [[(f"P{i}", "B-PER"), ("and", "O"), (f"L{i}", "B-LOC")] for i in range(30)]
    typo = _conll(tmp_path / "typo.txt", [*many, [("Oslo", "B-FOO"), ("x", "O")]])
    with warnings_module.catch_warnings(record=True) as seen:
        warnings_module.simplefilter("always")
        assert len(read_conll(typo)) == 31  # read, not refused: rare types exist
    lines = [str(w.message) for w in seen]
    assert lines == ["typo.txt:121: entity type 'FOO' (B-FOO) occurs once among 61 entities; a typo? It becomes a "
                     "label of its own"], lines
    with warnings_module.catch_warnings(record=True) as seen:  # POS tags are no IOB scheme; few entities: no noise
        warnings_module.simplefilter("always")
        read_conll(_conll(tmp_path / "few.txt", [*ok, [("Oslo", "B-FOO")]]))
        read_conll(tmp_path / "few.txt", tag_col=1)
    assert seen == []


def test_a_conll_file_without_blank_lines_warns_how_many_words_are_cut(tmp_path):
    from bertforge.tasks.conll import read_conll, warn_long_sentences

    words = [(f"w{i}", "B-PER" if i % 7 == 0 else "O") for i in range(600)]
    flat = _conll(tmp_path / "flat.txt", [words])
    with pytest.warns(UserWarning) as seen:
        warn_long_sentences(read_conll(flat), flat, 128)
    assert [str(w.message) for w in seen] == [
        f"{flat}: 1 sentence(s) have more words than --max-seq-len 128 holds (the longest 600): at least 474 words "
        "are cut off; is a blank line missing between sentences?"]


# ---- lengths and heads that the model cannot hold ----------------------------------------------------------------
def _sst2(path, n=8):
    path.write_text("sentence\tlabel\n" + "".join(f"the cat {i} sat\t{i % 2}\n" for i in range(n)))
    return path


def test_finetune_refuses_a_length_beyond_the_positions_and_a_head_of_another_task(two_layers, tmp_path):
    train = _sst2(tmp_path / "train.tsv")
    base = ["finetune", "--train", str(train), "--eval", str(train), "--max-steps", "1"]
    one_line(cli(*base, "--model", str(two_layers), "--task", "sst2", "--max-seq-len", "1000",
                 "--out", str(tmp_path / "a")),
             f"--max-seq-len 1000 is longer than the 64 positions of {two_layers}; use --max-seq-len 64 or less")
    # a model fine-tuned for SST-2 (what finetune writes into config.json), then asked for STS-B
    fr = _with_config(two_layers, tmp_path / "FR", bertforge_task={"name": "sst2", "kind": "classify"},
                      id2label={"0": "0", "1": "1"}, label2id={"0": 0, "1": 1})
    sts = _sts(tmp_path / "sts.tsv", ["1", "2", "3"])
    one_line(cli("finetune", "--model", str(fr), "--task", "stsb", "--train", str(sts), "--eval", str(sts),
                 "--text-col", "sentence1", "--text-pair-col", "sentence2", "--label-col", "score",
                 "--out", str(tmp_path / "b")),
             f"{fr} was fine-tuned for sst2 (2 labels); stsb is a regression task, so its head does not fit")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    one_line(cli("evaluate", "--model", str(fr), "--task", "sst2", "--eval", str(train), "--max-seq-len", "65"),
             f"--max-seq-len 65 is longer than the 64 positions of {fr}")


def test_longify_refuses_a_length_shorter_than_the_model_has(two_layers, tmp_path):
    one_line(cli("longify", "--model", str(two_layers), "--max-length", "10", "--out", str(tmp_path / "long")),
             f"--max-length 10 is shorter than the 64 positions {two_layers} already has")
    assert not (tmp_path / "long").exists()


def test_embed_train_refuses_a_labelled_classification_file(two_layers, tmp_path):
    from bertforge.embedding.data import read_examples
    from bertforge.errors import BertforgeError

    labelled = _sst2(tmp_path / "sst.tsv")
    one_line(cli("embed-train", "--model", str(two_layers), "--train", str(labelled), "--loss", "mnrl",
                 "--out", str(tmp_path / "et")), "sst.tsv:2: unrecognised record keys ['label', 'sentence']")
    assert not (tmp_path / "et").exists()
    (tmp_path / "nohead.tsv").write_text("".join(labelled.read_text().splitlines(keepends=True)[1:]))
    with pytest.raises(BertforgeError, match="every row's second column is a number"):
        read_examples(tmp_path / "nohead.tsv")
    (tmp_path / "pairs.tsv").write_text("the cat\na cat\nthe dog 2\ta dog\n".replace("\na cat", "\ta cat"))
    assert [e.texts for e in read_examples(tmp_path / "pairs.tsv").examples] == [["the cat", "a cat"],
                                                                                 ["the dog 2", "a dog"]]


# ---- tracebacks that are one line now ----------------------------------------------------------------------------
def test_pretrain_refuses_a_gpt_model_folder_as_tokenizer(tmp_path):
    import transformers

    from bertforge.tokenization import Tokenizer

    gpt = tmp_path / "gpt"
    tok = Tokenizer.train([f"the cat sat on the mat {i}" for i in range(200)], kind="gpt2", vocab_size=300,
                          min_frequency=1)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=tok.vocab_size,
                                                         n_positions=64)).save_pretrained(gpt)
    tok.save_pretrained(gpt)
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"the cat sat on the mat number {i}\n\n" for i in range(60)))
    one_line(cli("pretrain", "--tokenizer", str(gpt), "--corpus", str(corpus), "--size", "bert-tiny", "--seq-len",
                 "32", "--max-steps", "1", "--out", str(tmp_path / "pt")),
             f"--tokenizer {gpt}: a gpt2 tokenizer without a mask token cannot feed the mlm+nsp objective")
    assert not (tmp_path / "pt").exists()


def test_a_quantised_model_refuses_bf16_in_one_line_and_embeds_in_fp32(two_layers, tmp_path):
    q = tmp_path / "q"
    assert cli("quantize", "--model", str(two_layers), "--out", str(q)).returncode == 0
    (tmp_path / "in.txt").write_text("the cat\nthe dog\n")
    base = ["embed", "--model", str(q), "--input", str(tmp_path / "in.txt"), "--no-progress", "--out"]
    one_line(cli(*base, str(tmp_path / "bf.npy"), "--precision", "bf16"),
             "--precision bf16: the model holds int8 weights (bertforge quantize)")
    assert not (tmp_path / "bf.npy").exists()
    proc = cli(*base, str(tmp_path / "v.npy"))
    assert proc.returncode == 0, proc.stderr
    import numpy as np
    assert np.load(tmp_path / "v.npy").shape == (2, 32)


def test_index_build_on_a_full_disk_is_one_line_and_leaves_no_folder(two_layers, tmp_path):
    import resource
    import signal

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"passage number {i} about the cat and the dog\n" for i in range(400)))

    def small_disk() -> None:  # every write past 20 kB fails, as on a full disk; the 51 kB index cannot be written
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    out = tmp_path / "idx"
    proc = cli("index", "build", "--model", str(two_layers), "--corpus", str(corpus), "--out", str(out),
               "--no-progress", preexec_fn=small_disk)
    one_line(proc, f"{out / 'index.1.faiss'}", "cannot write: File too large")
    assert not out.exists()


@pytest.mark.parametrize("fields,message", [
    (dict(num_layers=3), "encoder_layers is 3 but model.safetensors holds 1 encoder layers"),
    (dict(num_decoder_layers=100), "decoder_layers is 100 but model.safetensors holds 1 decoder layers"),
    (dict(num_decoder_layers=100_000), "num_decoder_layers must be in 1..1024 (got 100000)"),  # config.checks
    (dict(vocab_size=10**10), "vocab_size must be in 1..16777216 (got 10000000000)"),
    (dict(vocab_size=10**6), "vocab_size is 1000000 but model.safetensors holds no tensor with a dimension"),
    (dict(d_model=65536), "d_model is 65536 but model.safetensors holds no tensor"),
    (dict(num_layers=-2), "num_layers must be in 1..1024 (got -2)"),
    (dict(dropout_rate=7), "dropout_rate must be between 0 and 1 (got 7)"),
    (dict(layer_norm_epsilon="abc"), "layer_norm_epsilon must be a number (got 'abc')"),
    (dict(pad_token_id=10**6), "pad_token_id is 1000000, past the vocabulary"),
])
def test_an_encoder_decoder_config_the_weights_do_not_have_is_refused_before_any_model_is_built(
        tmp_path, monkeypatch, fields, message):
    from bertforge.config.seq2seq import compose_seq2seq
    from bertforge.errors import BertforgeError
    from bertforge.model import seq2seq as seq2seq_module
    from bertforge.model.seq2seq.model import Seq2SeqLM

    seq2seq_module.Seq2SeqLM(compose_seq2seq("t5", "tiny", vocab_size=50, encoder_layers=1,
                                             decoder_layers=1)).save_pretrained(tmp_path / "t5")
    bad = _with_config(tmp_path / "t5", tmp_path / "bad", **fields)

    def allocated(*args, **kwargs):
        raise AssertionError("the model was built before config.json was checked against the weights")

    monkeypatch.setattr(seq2seq_module.Seq2SeqLM, "__init__", allocated)
    with pytest.raises(BertforgeError) as err:
        Seq2SeqLM.from_pretrained(bad)
    assert str(err.value).startswith(f"{bad / 'config.json'}: ") and message in str(err.value), str(err.value)


def test_a_nan_class_label_names_the_file_and_line(tmp_path):
    from bertforge.errors import BertforgeError
    from bertforge.tasks.table import read_table

    (tmp_path / "t.csv").write_text("text,label\nthe cat,pos\nthe dog,nan\n")
    with pytest.raises(BertforgeError, match=r"t.csv:3: the label 'nan' is a missing value, not a class"):
        read_table(tmp_path / "t.csv", "text", None, "label")
    (tmp_path / "t.jsonl").write_text('{"text": "a", "label": "pos"}\n{"text": "b", "label": NaN}\n')
    with pytest.raises(BertforgeError, match=r"t.jsonl:2: the label 'nan' is a missing value"):
        read_table(tmp_path / "t.jsonl", "text", None, "label")
    (tmp_path / "ok.csv").write_text("text,label\nthe cat,pos\nthe dog,neg\n")
    assert read_table(tmp_path / "ok.csv", "text", None, "label")[1] == ["neg", "pos"]
