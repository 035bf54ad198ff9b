"""The public Python API checks its arguments in one place shared with the command line (bertforge.config.arguments):
a wrong type or a value out of bounds is one `ArgumentError` (a ValueError and a TypeError) naming the parameter,
raised before any file is read, written or a model loaded; the command line says the same of the flag."""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

import bertforge
import bertforge.api
from bertforge.errors import ArgumentError, BertforgeError

M = "no-such-model-folder"


def _index():
    return object.__new__(bertforge.Index)  # a search's arguments are checked before the index is touched


# (what is called, the parameter its message must name)
CASES = {
    "embed(model=3)": (lambda o: bertforge.embed(3, ["a"]), "model"),
    "embed(model=None)": (lambda o: bertforge.embed(None, ["a"]), "model"),
    "embed(batch_size='32')": (lambda o: bertforge.embed(M, ["a"], batch_size="32"), "batch_size"),
    "embed(batch_size=0)": (lambda o: bertforge.embed(M, ["a"], batch_size=0), "batch_size"),
    "embed(normalize='no')": (lambda o: bertforge.embed(M, ["a"], normalize="no"), "normalize"),
    "embed(texts=None)": (lambda o: bertforge.embed(M, None), "texts"),
    "finetune(task=None)": (lambda o: bertforge.finetune(M, o, task=None, out=o / "x"), "task"),
    "finetune(out=None)": (lambda o: bertforge.finetune(M, o, task="sst2", out=None), "out"),
    "finetune(epochs='3')": (lambda o: bertforge.finetune(M, o, task="sst2", out=o / "x", epochs="3"), "epochs"),
    "finetune(max_steps=10**30)": (lambda o: bertforge.finetune(M, o, task="sst2", out=o / "x", max_steps=10**30),
                                   "max_steps"),
    "finetune(lr=nan)": (lambda o: bertforge.finetune(M, o, task="sst2", out=o / "x", lr=float("nan")), "lr"),
    "finetune(resume='yes')": (lambda o: bertforge.finetune(M, o, task="sst2", out=o / "x", resume="yes"),
                               "resume"),
    "finetune(seed=-1)": (lambda o: bertforge.finetune(M, o, task="sst2", out=o / "x", seed=-1), "seed"),
    "finetune(data=None, train=None)": (lambda o: bertforge.finetune(M, task="sst2", out=o / "x"), "data"),
    "evaluate(batch_size=1.5)": (lambda o: bertforge.evaluate(M, o, task="sst2", batch_size=1.5), "batch_size"),
    "predict(batch_size=0)": (lambda o: bertforge.predict(M, ["a"], batch_size=0), "batch_size"),
    "predict(inputs=None)": (lambda o: bertforge.predict(M, None), "inputs"),
    "distill(max_steps=0)": (lambda o: bertforge.distill(M, o, task="sst2", out=o / "x", max_steps=0), "max_steps"),
    "distill(lr=inf)": (lambda o: bertforge.distill(M, o, task="sst2", out=o / "x", lr=float("inf")), "lr"),
    "distill(alpha=2)": (lambda o: bertforge.distill(M, o, task="sst2", out=o / "x", alpha=2), "alpha"),
    "finetune(warmup_ratio=-0.1)": (lambda o: bertforge.finetune(M, o, task="sst2", out=o / "x", warmup_ratio=-0.1),
                                    "warmup_ratio"),
    "distill(teacher=None)": (lambda o: bertforge.distill(None, o, task="sst2", out=o / "x"), "teacher"),
    "prune(fraction=1.0)": (lambda o: bertforge.prune(M, o, task="sst2", out=o / "x", fraction=1.0), "fraction"),
    "prune(fraction='0.3')": (lambda o: bertforge.prune(M, o, task="sst2", out=o / "x", fraction="0.3"),
                              "fraction"),
    "quantize(out=None)": (lambda o: bertforge.quantize(M, None), "out"),
    "export(opset=13)": (lambda o: bertforge.export(M, o / "x", opset=13), "opset"),
    "export(format='tflite')": (lambda o: bertforge.export(M, o / "x", format="tflite"), "format"),
    "export(int8=1)": (lambda o: bertforge.export(M, o / "x", int8=1), "int8"),
    "fill_mask(top_k=0)": (lambda o: bertforge.fill_mask(M, "a [MASK]", top_k=0), "top_k"),
    "fill_mask(text=None)": (lambda o: bertforge.fill_mask(M, None), "text"),
    "generate(prompt=5)": (lambda o: bertforge.generate(M, 5), "prompt"),
    "generate(temperature=0)": (lambda o: bertforge.generate(M, "a", temperature=0), "temperature"),
    "generate(top_p=1.5)": (lambda o: bertforge.generate(M, "a", top_p=1.5), "top_p"),
    "generate(stream=True, a list)": (lambda o: bertforge.generate(M, ["a", "b"], stream=True), "prompt"),
    "info(model=None)": (lambda o: bertforge.info(None), "model"),
    "longify(max_length=10**9)": (lambda o: bertforge.longify(M, o / "x", max_length=10**9), "max_length"),
    "pretrain(max_steps=10**30)": (lambda o: bertforge.pretrain(texts=["a b"], out=o / "x", max_steps=10**30),
                                   "max_steps"),
    "pretrain(batch_size=0)": (lambda o: bertforge.pretrain(texts=["a b"], out=o / "x", batch_size=0), "batch_size"),
    "pretrain(seq_len=4)": (lambda o: bertforge.pretrain(texts=["a b"], out=o / "x", seq_len=4), "seq_len"),
    "pretrain(lr=nan)": (lambda o: bertforge.pretrain(texts=["a b"], out=o / "x", lr=float("nan")), "lr"),
    "prepare(tokenizer=None)": (lambda o: bertforge.prepare(texts=["a b"], tokenizer=None, out=o / "x"), "tokenizer"),
    "train_tokenizer(vocab_size='8000')": (lambda o: bertforge.train_tokenizer(texts=["a"], vocab_size="8000"),
                                           "vocab_size"),
    "train_tokenizer(lowercase='no')": (lambda o: bertforge.train_tokenizer(texts=["a"], lowercase="no"),
                                        "lowercase"),
    "train_sentence_encoder(epochs=0)": (lambda o: bertforge.train_sentence_encoder(M, o, out=o / "x", epochs=0),
                                         "epochs"),
    "evaluate_sentence_encoder(limit=0)": (lambda o: bertforge.evaluate_sentence_encoder(M, sts=o, limit=0),
                                           "limit"),
    "load_sentence_encoder(model=1.5)": (lambda o: bertforge.load_sentence_encoder(1.5), "model"),
    "read_texts(None)": (lambda o: bertforge.read_texts(None), "source"),
    "Index.build(batch_size=-1)": (lambda o: bertforge.Index.build(M, ["a"], batch_size=-1), "batch_size"),
    "Index.build(passages=None)": (lambda o: bertforge.Index.build(M, None), "passages"),
    "Index.load(None)": (lambda o: bertforge.Index.load(None), "path"),
    "Index.search(None)": (lambda o: _index().search(None), "queries"),
    "Index.search(k=0)": (lambda o: _index().search("q", k=0), "k"),
    "Index.search(k='5')": (lambda o: _index().search("q", k="5"), "k"),
    "create_app(None)": (lambda o: bertforge.create_app(None), "models"),
    "create_app(max_queue=0)": (lambda o: bertforge.create_app(M, max_queue=0), "max_queue"),
    "serve(port=70000)": (lambda o: bertforge.serve(M, port=70000), "port"),
    "attention_maps(text=None)": (lambda o: bertforge.attention_maps(M, None), "text"),
    "attention_maps(out='x.txt')": (lambda o: bertforge.attention_maps(M, "a", out=o / "x.txt"), "out"),
    "head_statistics(clusters=0)": (lambda o: bertforge.head_statistics(M, ["a"], clusters=0), "clusters"),
    "probe(epochs=0)": (lambda o: bertforge.probe(M, o, task="pos", epochs=0), "epochs"),
    "head_importance(max_examples=0)": (lambda o: bertforge.head_importance(M, o, task="sst2", max_examples=0),
                                        "max_examples"),
    "explain(steps=0)": (lambda o: bertforge.explain(M, "a", steps=0), "steps"),
    "ask(question=None)": (lambda o: bertforge.ask(None, index=o, reader=M), "question"),
    "ask(k=0)": (lambda o: bertforge.ask("q", index=o, reader=M, k=0), "k"),
    "evaluate_open_qa(limit=0)": (lambda o: bertforge.evaluate_open_qa(o, o / "q.jsonl", limit=0), "limit"),
    "train_retriever(hard_negatives=-1)": (lambda o: bertforge.train_retriever(M, o, out=o / "x", hard_negatives=-1),
                                           "hard_negatives"),
    "train_retriever(warmup_ratio=2)": (lambda o: bertforge.train_retriever(M, o, out=o / "x", warmup_ratio=2.0),
                                        "warmup_ratio"),
    "export_dpr(model=None)": (lambda o: bertforge.export_dpr(None, o / "x"), "model"),
}


@pytest.fixture
def nothing_loaded(monkeypatch):
    """A model name resolved or a folder opened fails the test: the arguments come first."""
    import bertforge.io.hub as hub
    import bertforge.model.folder as folder

    def refuse(*args, **kwargs):
        raise AssertionError("a model was resolved or opened before the arguments were checked")

    monkeypatch.setattr(hub, "resolve_model_path", refuse)
    monkeypatch.setattr(hub, "resolve_model_option", refuse)
    monkeypatch.setattr(folder.ModelFolder, "open", refuse)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_wrong_argument_is_one_error_naming_the_parameter_before_any_work(case, tmp_path, nothing_loaded):
    call, param = CASES[case]
    (tmp_path / "in").mkdir()
    with pytest.raises(ArgumentError) as caught:
        call(tmp_path / "in")
    err = caught.value
    assert isinstance(err, ValueError) and isinstance(err, TypeError) and isinstance(err, BertforgeError)
    message = str(err)
    assert "\n" not in message and message.startswith(param), message
    assert "--" not in message, f"a Python message names a flag: {message}"
    assert [p.name for p in tmp_path.iterdir()] == ["in"] and not any((tmp_path / "in").iterdir()), \
        "something was written"


def test_the_exception_is_exported():
    assert bertforge.ArgumentError is ArgumentError
    assert issubclass(ArgumentError, (ValueError, TypeError))


def test_good_arguments_pass_the_checks():
    from bertforge.config.arguments import BOOL, COUNT, EPOCHS, MODEL, POSITIVE, STEPS, check_args, maybe

    check_args({"a": 3, "b": 2.5, "c": None, "d": True, "e": 10**9, "m": "folder"}, a=COUNT, b=POSITIVE,
               c=maybe(EPOCHS), d=BOOL, e=STEPS, m=MODEL)
    import numpy as np

    check_args({"n": np.int64(4), "x": np.float32(0.5)}, n=COUNT, x=POSITIVE)  # numpy scalars are numbers


def test_the_parser_and_the_api_share_the_bounds():
    """The same object bounds a flag's text and a Python value: --max-steps and max_steps refuse the same."""
    import argparse

    from bertforge.commands import bounds
    from bertforge.config import arguments

    assert bounds.STEPS is arguments.STEPS and bounds.Number is arguments.Number
    for spec in (arguments.STEPS, arguments.EPOCHS, arguments.POSITIVE, arguments.INNER_FRACTION):
        for text in spec.bad_values():
            if text == "x":
                continue
            with pytest.raises(argparse.ArgumentTypeError):
                spec(text)
            value = float(text) if not spec.integer or "." in text or text in ("nan", "inf", "-inf") else int(text)
            with pytest.raises(ArgumentError):
                spec.check(value, "p")
        good = spec(spec.good_value())
        assert spec.check(good, "p") == good


def _public_functions():
    for name in bertforge.api.__all__:
        obj = getattr(bertforge.api, name)
        if inspect.isfunction(obj):
            yield name, obj
    for method in ("build", "load", "merge", "save", "add", "search"):
        yield f"Index.{method}", getattr(bertforge.Index, method)


@pytest.mark.parametrize("name,function", list(_public_functions()))
def test_every_public_function_checks_its_arguments_first(name, function):
    """Its first statement (after the docstring and imports) is the one checking helper."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body
    first = next(s for s in body if not isinstance(s, (ast.Import, ast.ImportFrom))
                 and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)))
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call), ast.dump(first)[:200]
    assert getattr(first.value.func, "id", "") in ("check_args", "_check_serving"), ast.unparse(first)


def test_the_command_line_names_the_flag_of_an_api_argument_error(tmp_path, capsys):
    from bertforge.cli import main

    (tmp_path / "m").mkdir()
    assert main(["analyze", "explain", "--model", str(tmp_path / "m"), "--text", "a", "--out",
                 str(tmp_path / "why.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out {tmp_path / 'why.txt'}: expected a .png or .html file" in err[0], err


def test_finetune_defaults_are_written_once():
    """The parser's defaults and the API's signature defaults are FinetuneConfig's."""
    import dataclasses

    from bertforge.cli import build_parser
    from bertforge.tasks.config import FinetuneConfig

    config = {f.name: f.default for f in dataclasses.fields(FinetuneConfig)}
    parsed = vars(build_parser().parse_args(["finetune", "--task", "sst2", "--model", "m", "--out", "o"]))
    for name in ("epochs", "max_steps", "lr", "batch_size", "eval_batch_size", "warmup_ratio", "weight_decay", "seed",
                 "runs", "doc_stride", "max_query_length", "max_target_len", "num_beams", "train_limit"):
        assert parsed[name] == config[name], name
    signature = inspect.signature(bertforge.finetune).parameters
    for name in ("epochs", "max_steps", "lr", "batch_size", "seed", "runs", "device"):
        assert signature[name].default == config[name], name
    assert inspect.signature(bertforge.evaluate).parameters["batch_size"].default == config["eval_batch_size"]
    assert parsed["limit"] is config["eval_limit"] is None


def test_a_config_built_in_code_meets_the_same_bounds():
    from bertforge.tasks.config import FinetuneConfig

    for field, value in (("batch_size", 0), ("epochs", float("nan")), ("max_steps", 10**30), ("runs", 0),
                         ("warmup_ratio", 1.5), ("seed", -1)):
        with pytest.raises(ArgumentError, match=f"^{field}="):
            FinetuneConfig(task="sst2", model="m", out="o", **{field: value})
