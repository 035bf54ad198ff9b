"""`bertforge serve` stays fair while a client misbehaves: real servers on 127.0.0.1, hostile clients in threads.

The goal test runs three misbehaving clients at once (sockets trickling header bytes past the connection cap, a
7.5 MB body sent again and again, a client that asks for large answers and never reads them) while a keyed client
opens a fresh connection for each `/health` and small `/embed`: each answers within 1 s. Then: SIGTERM with a stuck
client exits within --graceful-timeout; the 503 of a full server is an HTTP response; --max-request-chars is 413;
the character cut for `truncate` leaves the vectors as they were; queued work of a client that went away is dropped;
a 2-label cross-encoder re-ranks by label 1's logit. Every loop is bounded in time.
"""
from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from test_serve import _start, _stop  # noqa: E402

from bertforge.config import ModelConfig  # noqa: E402
from bertforge.embedding import SentenceEncoder  # noqa: E402
from bertforge.errors import BertforgeError  # noqa: E402
from bertforge.model.heads import MaskedLM  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

KEY = "k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}
WORDS = "the cat sat on a mat while dog ran to park near tree and bird sang song in morning light".split()


def _text(n_words: int, seed: int = 0) -> str:
    return " ".join(WORDS[(seed + k * 7) % len(WORDS)] for k in range(n_words))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    from bertforge.embedding.cross_encoder import CrossEncoder

    root = tmp_path_factory.mktemp("abuse")
    tok = Tokenizer.train([_text(12, i) for i in range(200)], kind="wordpiece", vocab_size=120, min_frequency=1)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=48)
    torch.manual_seed(0)
    MaskedLM(cfg).save_pretrained(root / "mlm", tokenizer=tok)
    for labels in (2, 3):
        torch.manual_seed(labels)
        CrossEncoder(cfg, tok, num_labels=labels).save_pretrained(root / f"ce{labels}")
    return {"mlm": root / "mlm", "ce2": root / "ce2", "ce3": root / "ce3"}


@pytest.fixture(scope="module")
def guarded(dirs):
    """One server for most tests: a key, 64 connections, a 4 s header and a 1 s write deadline, 200,000 characters
    a request; one torch thread (on a loaded machine more threads only wait for each other)."""
    proc, url = _start("--model", str(dirs["mlm"]), "--model", f"ce={dirs['ce2']}", "--api-key", KEY,
                       "--max-connections", "64", "--header-timeout", "4", "--write-timeout", "1",
                       "--max-request-chars", "200000", "--threads", "1")
    yield url
    _stop(proc)


def _request(method: str, path: str, body: bytes = b"", key: bool = True) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + (f"Authorization: Bearer {KEY}\r\n" if key else "") + "\r\n").encode() + body


# ---- the misbehaving clients (threads; each stops when `stop` is set) ------------------------------------------------
def _trickler(port: int, stop: threading.Event, seen: dict, sockets: int = 100) -> None:
    """Keeps `sockets` connections open, each sending one header byte every 0.1 s, never a complete request;
    reopens those the server closes."""
    open_: list[socket.socket] = []
    while not stop.is_set():
        while len(open_) < sockets and not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=1)
                s.sendall(b"GET /info HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                s.setblocking(False)
                open_.append(s)
            except OSError:
                break
        seen["max_open"] = max(seen.get("max_open", 0), len(open_))
        for s in list(open_):
            try:
                answer = s.recv(64)
            except BlockingIOError:
                answer = None
            except OSError:
                answer = b""
            if answer is not None:  # closed by the server (evicted: 503; too slow: 408)
                seen[answer[:12]] = seen.get(answer[:12], 0) + 1
                s.close()
                open_.remove(s)
                continue
            try:
                s.send(b"a")
            except OSError:
                s.close()
                open_.remove(s)
        stop.wait(0.1)
    for s in open_:
        s.close()


def _huge_bodies(port: int, stop: threading.Event, seen: dict) -> None:
    """A keyed client that sends a 7.5 MB /embed (truncate: true) again and again (a fifth of a second apart: the
    point is the size of each, not a flood of bytes)."""
    body = json.dumps({"inputs": ["word " * 1_500_000], "truncate": True}).encode()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=30) as c:
        while not stop.is_set():
            try:
                r = c.post("/embed", content=body, headers={"Content-Type": "application/json"})
                seen[r.status_code] = seen.get(r.status_code, 0) + 1
            except httpx.HTTPError as err:
                seen[type(err).__name__] = seen.get(type(err).__name__, 0) + 1
            stop.wait(0.2)


def _non_reader(port: int, stop: threading.Event, seen: dict) -> None:
    """Asks for large /tokenize answers (several, pipelined) on a socket with a tiny receive buffer, and never
    reads; opens another once the server gives up on it."""
    body = json.dumps({"inputs": _text(30000)}).encode()  # answers of 2 MB: four fill the kernel's buffers
    while not stop.is_set():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(1)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(_request("POST", "/tokenize", body) * 4)
            seen["sent"] = seen.get("sent", 0) + 1
            while not stop.is_set():  # never reads; notices when the server drops it
                stop.wait(0.2)
                try:
                    s.send(b"")
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        break
                except OSError:
                    break
        except OSError:
            pass
        finally:
            s.close()


# ---- the goal ------------------------------------------------------------------------------------------------------
def test_health_and_small_embed_answer_within_a_second_while_clients_misbehave(guarded):
    url = guarded
    port = int(url.rsplit(":", 1)[1])
    stop = threading.Event()
    seen: dict[str, dict] = {"trickle": {}, "huge": {}, "mute": {}}
    threads = [threading.Thread(target=f, args=(port, stop, seen[k]), daemon=True)
               for f, k in ((_trickler, "trickle"), (_huge_bodies, "huge"), (_non_reader, "mute"))]
    try:
        for t in threads:
            t.start()
        time.sleep(2.0)  # the cap is reached and the misbehaviour under way
        took = {"/health": [], "/embed": []}
        fresh = httpx.Limits(max_keepalive_connections=0)  # a new connection each time: it must get a slot
        with httpx.Client(base_url=url, headers=AUTH, timeout=10, limits=fresh) as client:
            for i in range(8):
                for path in took:
                    t0 = time.perf_counter()
                    r = client.get(path) if path == "/health" else client.post(
                        "/embed", json={"inputs": [_text(6, i)]})
                    took[path].append(time.perf_counter() - t0)
                    assert r.status_code == 200, (path, r.status_code, r.text)
                time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert max(took["/health"]) < 1.0 and max(took["/embed"]) < 1.0, took
    # the misbehaviour was real: the cap was held and broken into, the huge bodies refused, the reader stuck
    assert seen["trickle"]["max_open"] >= 64 and seen["trickle"].get(b"HTTP/1.1 503", 0) > 0, seen["trickle"]
    assert seen["huge"].get(413, 0) > 0 and 200 not in seen["huge"], seen["huge"]
    assert seen["mute"].get("sent", 0) >= 1, seen["mute"]


def test_sigterm_with_a_stuck_client_exits_within_the_graceful_timeout(dirs):
    proc, url = _start("--model", str(dirs["mlm"]), "--graceful-timeout", "3", "--write-timeout", "60")
    port = int(url.rsplit(":", 1)[1])
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.connect(("127.0.0.1", port))
        # four pipelined 2 MB answers: more than the kernel's buffers hold, so the server cannot finish writing
        s.sendall(_request("POST", "/tokenize", json.dumps({"inputs": _text(30000)}).encode(), key=False) * 4)
        deadline = time.time() + 20
        while time.time() < deadline:  # an answer is being written
            if "bertforge_requests_in_flight 1" in httpx.get(url + "/metrics").text:
                break
            time.sleep(0.2)
        time.sleep(2)  # and stuck
        assert "bertforge_requests_in_flight 1" in httpx.get(url + "/metrics").text
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        took = time.perf_counter() - t0
    finally:
        s.close()
        _stop(proc)
    assert code in (0, -signal.SIGTERM), code
    assert took < 3.0 + 0.75, took


@pytest.mark.slow  # 5 s of waiting; the goal test's non-reading client goes through the same deadline
def test_write_deadline_drops_a_client_that_does_not_read(guarded):
    url = guarded
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    s.sendall(_request("POST", "/tokenize", json.dumps({"inputs": _text(30000)}).encode()) * 4)
    time.sleep(5)  # 1 s without progress, and the tokenizing before it
    got, s_err = b"", None
    s.settimeout(5)
    try:
        while chunk := s.recv(1 << 16):
            got += chunk
    except OSError as err:
        s_err = err
    s.close()
    full = httpx.post(url + "/tokenize", json={"inputs": _text(30000)}, headers=AUTH, timeout=30)
    # the first answers went into the kernel's buffers; the rest never went out: the connection was dropped
    assert got.startswith(b"HTTP/1.1 200") and len(got) < 4 * len(full.content), (len(got), len(full.content),
                                                                                  s_err)


@pytest.mark.slow  # a server of its own; the reliability table's full_server_503 row checks the same by default
def test_a_full_server_answers_503_as_http(dirs):
    proc, url = _start("--model", str(dirs["mlm"]), "--max-connections", "4", "--read-timeout", "20")
    port = int(url.rsplit(":", 1)[1])
    busy = []
    try:
        for _ in range(4):  # inside a request (headers in, body pending): never evicted
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 50\r\n\r\n")
            busy.append(s)
        time.sleep(0.3)
        answers = []
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + b"X" * 20000)  # still sending at the close
                s.settimeout(5)
                try:
                    answers.append(s.recv(4096))
                except OSError as err:
                    answers.append(repr(err).encode())
    finally:
        for s in busy:
            s.close()
        _stop(proc)
    assert all(a.startswith(b"HTTP/1.1 503") for a in answers), answers
    assert json.loads(answers[0].split(b"\r\n\r\n", 1)[1])["type"] == "overloaded"


def test_over_max_request_chars_is_413_and_truncation_by_characters_changes_nothing(guarded, dirs):
    from bertforge.embedding.cross_encoder import CrossEncoder

    with httpx.Client(base_url=guarded, headers=AUTH, timeout=30) as c:
        r = c.post("/embed", json={"inputs": ["a" * 150000, "b" * 60000], "truncate": True})
        assert r.status_code == 413 and r.json()["field"] == "inputs", r.text
        assert "210000 characters" in r.json()["error"] and "\n" not in r.json()["error"]
        assert c.post("/tokenize", json={"inputs": "c " * 100001}).status_code == 413
        # ordinary long texts, one with long runs of spaces, one without any: cut by characters, then truncated
        texts = [_text(900, 1), _text(5), ("dog" + " " * 400) * 12 + _text(300), "catsat" * 400]
        r = c.post("/embed", json={"inputs": texts, "truncate": True, "model": "mlm"})
        assert r.status_code == 200, r.text
        want = SentenceEncoder.from_pretrained(dirs["mlm"]).encode(texts, progress=False)
        assert np.abs(np.array(r.json(), dtype=np.float32) - want).max() < 1e-6
        untruncated = c.post("/embed", json={"inputs": texts[:2], "model": "mlm"})
        assert untruncated.status_code == 413 and untruncated.json()["field"] == "inputs[0]"
        # pairs: each side cut; a 2-label cross-encoder re-ranks by label 1's logit
        query, docs = _text(400, 3), [_text(700, 2), _text(4), _text(20, 5)]
        r = c.post("/rerank", json={"query": query, "texts": docs, "truncate": True, "model": "ce"})
        assert r.status_code == 200, r.text
    logits = CrossEncoder.from_pretrained(dirs["ce2"]).predict([query] * 3, docs)
    assert np.allclose([h["score"] for h in sorted(r.json(), key=lambda h: h["index"])], logits[:, 1], atol=1e-5)


def test_index_rerank_takes_label_1_of_a_2_label_model_and_refuses_3_labels(dirs):
    from bertforge.embedding.cross_encoder import CrossEncoder
    from bertforge.retrieval.index import Hit, rerank

    hits = [Hit(i + 1, 1.0 - i / 10, str(i), _text(8, i), title="") for i in range(4)]
    two = CrossEncoder.from_pretrained(dirs["ce2"])
    logits = two.predict(["where is the cat"] * 4, [h.text for h in hits])
    ranked = rerank(hits, "where is the cat", two)
    assert [h.id for h in ranked] == [str(i) for i in np.argsort(-logits[:, 1], kind="stable")]
    assert np.allclose([h.rerank_score for h in ranked], np.sort(logits[:, 1])[::-1], atol=1e-6)
    with pytest.raises(BertforgeError, match=r"ce3 has 3 labels") as err:
        rerank(hits, "where is the cat", CrossEncoder.from_pretrained(dirs["ce3"]))
    assert "\n" not in str(err.value)


def test_queued_work_of_a_cancelled_request_is_dropped():
    from bertforge.server.batcher import Batcher
    from bertforge.server.registry import Operation

    calls: list[list[int]] = []
    entered, release = threading.Event(), threading.Event()

    def run(inputs: list[int]) -> list[int]:
        calls.append(list(inputs))
        if -1 in inputs:
            entered.set()
            release.wait(10)
        return inputs

    op = Operation("echo", run)

    async def main() -> None:
        b = Batcher(max_batch_tokens=1000, max_wait_ms=0, max_in_flight=1)
        b.start()
        blocker = asyncio.create_task(b.submit(op, [-1], [1]))
        for _ in range(1000):
            if entered.is_set():
                break
            await asyncio.sleep(0.005)
        gone = asyncio.create_task(b.submit(op, [7], [1]))
        kept = asyncio.create_task(b.submit(op, [8], [1]))
        await asyncio.sleep(0.05)
        gone.cancel()  # its client went away (server.app.Around cancels the request)
        release.set()
        await blocker
        assert (await kept).results == [8]
        await b.stop()

    asyncio.run(main())
    assert calls == [[-1], [8]], calls


def test_a_client_that_leaves_has_its_queued_work_dropped(dirs):
    """Over HTTP: a request whose client disconnects while it waits for the busy inference thread never runs."""
    import uvicorn

    from bertforge.server import ServedModel, ServeOptions, create_app
    from bertforge.server.limits import bounded_protocol
    from bertforge.server.registry import EMBED, Operation

    calls: list[list[str]] = []
    entered, release = threading.Event(), threading.Event()

    def embed(texts: list[str]) -> list[np.ndarray]:
        calls.append(list(texts))
        if "hold" in texts:
            entered.set()
            release.wait(10)
        return [np.ones(4, np.float32) for _ in texts]

    model = ServedModel("m", dirs["mlm"], Tokenizer.from_pretrained(dirs["mlm"]), 40, 4)
    model.ops[EMBED] = Operation(EMBED, embed)
    app = create_app({"m": model}, ServeOptions(max_wait_ms=0, batches_in_flight=1))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           http=bounded_protocol(5, 16)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        holder = threading.Thread(target=lambda: httpx.post(f"http://127.0.0.1:{port}/embed",
                                                            json={"inputs": ["hold"]}, timeout=20))
        holder.start()
        assert entered.wait(10)
        with socket.create_connection(("127.0.0.1", port)) as s:  # queued behind "hold", then gone
            s.sendall(_request("POST", "/embed", json.dumps({"inputs": ["gone"]}).encode(), key=False))
            time.sleep(0.3)
        time.sleep(0.3)
        release.set()
        holder.join(20)
        r = httpx.post(f"http://127.0.0.1:{port}/embed", json={"inputs": ["after"]}, timeout=20)
        assert r.status_code == 200
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        release.set()
        server.should_exit = True
        thread.join(10)
    assert calls == [["hold"], ["after"]], calls
    assert 'bertforge_requests_total{route="/embed",status="499"} 1' in metrics


def test_slots_make_room_per_address_and_keyless_first():
    """The slot rules on their own: the oldest waiting connection makes room, keyless before keyed, one address
    only ever evicts its own, and a server of busy connections refuses."""
    from bertforge.server.limits import _Slots

    class Conn:
        def __init__(self, ip: str, keyed: bool = False) -> None:
            self.client, self.keyed, self.evicted = (ip, 1), keyed, False

        def evict(self) -> None:
            self.evicted = True
            slots.release(self)

    slots = _Slots(max_connections=4, per_client=3)
    a1, a2, b1 = Conn("a", keyed=True), Conn("a"), Conn("b")
    for c in (a1, a2, b1):
        assert slots.admit(c)
        slots.wait(c)
    a3 = Conn("a")
    assert slots.admit(a3) and not any(c.evicted for c in (a1, a2, b1))  # 4 open, 3 from a
    a4 = Conn("a")
    assert slots.admit(a4) and a2.evicted and not a1.evicted  # a is full: its oldest keyless waiting one
    slots.busy(a3)
    slots.busy(a4)
    b2 = Conn("b")
    assert slots.admit(b2) and b1.evicted  # the server is full: the oldest keyless waiting one, b1 (a3, a4 busy)
    slots.busy(b2)
    c1 = Conn("c")
    assert slots.admit(c1) and a1.evicted  # only the keyed a1 was still waiting
    slots.busy(c1)
    assert not slots.admit(Conn("d"))  # every slot inside a request: 503
