"""Experiment trackers and run files through the installed console script: `--report-to tensorboard|mlflow` write
metrics.jsonl's scalars (same names, same steps) through TensorBoard's and MLflow's own writers, read back here
with their own readers; a missing tracker library is one line before any work; `--config FILE` (a run's own
run_options.json, JSON or YAML) reproduces a run byte for byte, flags override it, bad keys are one line."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertforge.model.checkpoint import save_pretrained
from bertforge.config import preset
from bertforge.model import Encoder
from bertforge.tokenization import Tokenizer

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
WORDS = "the cat dog bird sat ran on under a mat tree river red green small big and but then".split()
POS, NEG = ["good", "great", "fine"], ["bad", "awful", "dull"]
TINY_PRETRAIN = ["--size", "bert-tiny", "--seq-len", "32", "--batch-size", "8", "--vocab-size", "120",
                 "--no-progress", "--heldout-fraction", "0.1", "--eval-batches", "2", "--threads", "1",
                 "--max-steps", "6", "--log-every", "2"]


def cli(*args: object, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    assert BERTFORGE, "the bertforge console script is not installed"
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    full.pop("MLFLOW_TRACKING_URI", None)  # the default store under OUT/mlruns is what is tested
    return subprocess.run([BERTFORGE, *map(str, args)], capture_output=True, text=True, env=full, timeout=300,
                          cwd=cwd)


def one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def expected_scalars(out: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl's numbers as {"SPLIT/KEY": {step: value}}."""
    want: dict[str, dict[int, float]] = {}
    for rec in records(out):
        for k, v in rec.items():
            if k not in ("step", "split") and isinstance(v, (int, float)) and not isinstance(v, bool):
                want.setdefault(f"{rec['split']}/{k}", {})[rec["step"]] = float(v)
    return want


def tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def mlflow_run(store: Path):
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
    client = MlflowClient(store.resolve().as_uri())
    experiment = client.get_experiment_by_name("bertforge")
    [run] = client.search_runs([experiment.experiment_id])
    metrics = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
               for key in run.data.metrics}
    return run, metrics


def assert_trackers_match(out: Path) -> None:
    want = expected_scalars(out)
    assert "train/loss" in want and any(k.startswith("eval/") for k in want)
    # TensorBoard stores float32: equal to metrics.jsonl's value rounded to float32
    tb = tensorboard_scalars(out / "runs")
    assert tb.keys() == want.keys()
    for tag, by_step in want.items():
        assert tb[tag].keys() == by_step.keys(), tag
        for step, value in by_step.items():
            assert tb[tag][step] == float(torch.tensor(value, dtype=torch.float32)), (tag, step)
    # MLflow stores float64: exactly metrics.jsonl's values; the run's recorded options are its params
    run, ml = mlflow_run(out / "mlruns")
    assert ml == want
    assert run.info.status == "FINISHED" and run.info.run_name == out.name
    options = json.loads((out / "run_options.json").read_text())["options"]
    assert {k.lstrip("-"): v for k, v in run.data.params.items()} == {
        k.lstrip("-"): v if isinstance(v, str) else json.dumps(v) for k, v in options.items()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    docs = [" ".join(" ".join(rng.choices(WORDS, k=rng.randint(5, 9))).capitalize() + "."
                     for _ in range(rng.randint(4, 6))) for _ in range(120)]
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny random BERT whose vocabulary holds every word of the sentiment data whole."""
    d = tmp_path_factory.mktemp("base")
    rng = random.Random(0)
    vocab = POS + NEG + WORDS
    tok = Tokenizer.train([" ".join(rng.choices(vocab, k=10)) for _ in range(300)], vocab_size=100, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), d / "model", cfg, tokenizer=tok)
    return d / "model"


@pytest.fixture(scope="module")
def sst(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sst")
    for name, n, seed in (("train", 48, 0), ("dev", 16, 1)):
        rng, lines = random.Random(seed), ["sentence\tlabel"]
        for _ in range(n):
            y = rng.randint(0, 1)
            lines.append(" ".join(rng.choices(WORDS, k=4) + [rng.choice(POS if y else NEG)]) + f"\t{y}")
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


FINETUNE = ["--task", "sst2", "--epochs", "2", "--batch-size", "16", "--lr", "1e-3", "--no-progress"]


# ---- --report-to ----------------------------------------------------------------------------------------------------
def test_pretrain_reports_the_same_scalars_to_tensorboard_and_mlflow(corpus, tmp_path):
    out = tmp_path / "pre"
    proc = cli("pretrain", "--corpus", corpus, *TINY_PRETRAIN, "--out", out,
               "--report-to", "tensorboard", "--report-to", "mlflow")  # repeated
    assert proc.returncode == 0, proc.stderr
    assert_trackers_match(out)


def test_finetune_reports_the_same_scalars_to_tensorboard_and_mlflow(base, sst, tmp_path):
    out = tmp_path / "ft"
    proc = cli("finetune", "--model", base, "--data", sst, "--out", out, *FINETUNE,
               "--report-to", "tensorboard,mlflow")  # comma-separated
    assert proc.returncode == 0, proc.stderr
    assert_trackers_match(out)


def test_logging_dir_and_none(base, sst, tmp_path):
    out, logs = tmp_path / "ft", tmp_path / "tb"
    proc = cli("finetune", "--model", base, "--data", sst, "--out", out, *FINETUNE,
               "--report-to", "tensorboard", "--logging-dir", logs)
    assert proc.returncode == 0, proc.stderr
    assert not (out / "runs").exists() and not (out / "mlruns").exists()
    assert tensorboard_scalars(logs).keys() == expected_scalars(out).keys()
    out2 = tmp_path / "ft2"
    proc = cli("finetune", "--model", base, "--data", sst, "--out", out2, *FINETUNE,
               "--report-to", "none")
    assert proc.returncode == 0, proc.stderr
    assert not (out2 / "runs").exists() and not (out2 / "mlruns").exists()
    assert (out2 / "metrics.jsonl").read_bytes() == (out / "metrics.jsonl").read_bytes()  # trackers change nothing


@pytest.mark.parametrize("tracker, package", [("tensorboard", "tensorboard"), ("mlflow", "mlflow")])
def test_a_missing_tracker_library_is_one_line_before_any_work(corpus, base, sst, tmp_path, tracker, package):
    # a package of that name that fails to import, ahead of the installed one on the path
    blocker = tmp_path / "blocker"
    (blocker / package).mkdir(parents=True)
    (blocker / package / "__init__.py").write_text(f"raise ModuleNotFoundError({'No module named ' + package!r})\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    line = f"--report-to {tracker} needs the {package} package: pip install 'bertforge[{tracker}]'"
    for verb in (["pretrain", "--corpus", corpus, *TINY_PRETRAIN],
                 ["finetune", "--model", base, "--data", sst, *FINETUNE],
                 ["distill", "task", "--teacher", base, "--task", "sst2", "--data", sst]):
        out = tmp_path / f"out-{verb[0]}"
        proc = cli(*verb, "--out", out, "--report-to", f"none,{tracker}" if verb[0] == "finetune" else tracker,
                   env=env)
        assert one_line(proc).endswith(line), proc.stderr
        assert not out.exists()  # refused before the output folder was claimed


def test_an_unknown_tracker_is_one_line(base, sst, tmp_path):
    one_line(cli("finetune", "--model", base, "--data", sst, "--out", tmp_path / "o", *FINETUNE,
                 "--report-to", "wandb"), "--report-to: unknown tracker 'wandb'", "tensorboard, mlflow, none")


# ---- --config ------------------------------------------------------------------------------------------------------
def test_pretrain_run_options_reproduce_the_run_and_flags_override(corpus, tmp_path):
    first, again, shorter = tmp_path / "first", tmp_path / "again", tmp_path / "shorter"
    proc = cli("pretrain", "--corpus", corpus, *TINY_PRETRAIN, "--out", first)
    assert proc.returncode == 0, proc.stderr
    proc = cli("pretrain", "--config", first / "run_options.json", "--out", again)
    assert proc.returncode == 0, proc.stderr
    assert (again / "metrics.jsonl").read_bytes() == (first / "metrics.jsonl").read_bytes()
    assert (json.loads((again / "run_options.json").read_text())["options"]
            == json.loads((first / "run_options.json").read_text())["options"])
    # a flag on the command line wins over the file
    proc = cli("pretrain", "--config", first / "run_options.json", "--out", shorter, "--max-steps", "4")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((shorter / "run_options.json").read_text())["options"]["max_steps"] == 4
    assert max(r["step"] for r in records(shorter)) == 4 < max(r["step"] for r in records(first))


def test_finetune_run_options_reproduce_the_run(base, sst, tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    proc = cli("finetune", "--model", base, "--data", sst, "--out", first, *FINETUNE)
    assert proc.returncode == 0, proc.stderr
    # --task and --model are required flags: the file gives them
    proc = cli("finetune", "--config", first / "run_options.json", "--out", again)
    assert proc.returncode == 0, proc.stderr
    assert (again / "metrics.jsonl").read_bytes() == (first / "metrics.jsonl").read_bytes()


def test_a_yaml_config_with_flag_names(base, sst, tmp_path):
    pytest.importorskip("yaml")
    json_cfg, yaml_cfg = tmp_path / "c.json", tmp_path / "c.yaml"
    json_cfg.write_text(json.dumps({"task": "sst2", "model": str(base), "data": str(sst), "max-steps": 3,
                                    "batch_size": 16, "--lr": 1e-3, "progress": False}))
    # 1e-3 without a dot is a string to PyYAML: taken as the command line would take it
    yaml_cfg.write_text(f"task: sst2\nmodel: {base}\ndata: {sst}\nmax-steps: 3\nbatch_size: 16\n--lr: 1e-3\n"
                        "progress: false\n")
    for cfg, out in ((json_cfg, tmp_path / "j"), (yaml_cfg, tmp_path / "y")):
        proc = cli("finetune", "--config", cfg, "--out", out)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "j" / "metrics.jsonl").read_bytes() == (tmp_path / "y" / "metrics.jsonl").read_bytes()
    assert json.loads((tmp_path / "y" / "run_options.json").read_text())["options"]["lr"] == 1e-3


def test_config_errors_are_one_line_naming_the_key_and_file(base, sst, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "sst2", "model": str(base), "data": str(sst), "learning_rate": 1e-3}))
    one_line(cli("finetune", "--config", cfg, "--out", tmp_path / "o"),
             f"--config {cfg}: unknown option 'learning_rate'")
    cfg.write_text(json.dumps({"task": "sst2", "model": str(base), "data": str(sst), "batch_size": "big"}))
    one_line(cli("finetune", "--config", cfg, "--out", tmp_path / "o"), "batch_size: expected an integer, got 'big'")
    cfg.write_text(json.dumps({"task": "nope", "model": str(base)}))
    one_line(cli("finetune", "--config", cfg, "--out", tmp_path / "o"), "task: 'nope' is not one of")
    cfg.write_text(json.dumps({"max_steps": 2, "corpus": "x.txt"}))
    one_line(cli("pretrain", "--config", cfg, "--out", tmp_path / "o"), "corpus: expected a list")
    cfg.write_text("[1, 2]")
    one_line(cli("ablate", "--config", cfg), f"{cfg}: expected a JSON dict, found list")
    one_line(cli("distill", "general", "--config", tmp_path / "missing.json"), "missing.json: no such file")
    assert not (tmp_path / "o").exists()


def test_distill_task_run_options_reproduce_the_run(base, sst, tmp_path):
    teacher, first, again = tmp_path / "teacher", tmp_path / "first", tmp_path / "again"
    proc = cli("finetune", "--model", base, "--data", sst, "--out", teacher, *FINETUNE)
    assert proc.returncode == 0, proc.stderr
    proc = cli("distill", "task", "--teacher", teacher, "--task", "sst2", "--data", sst, "--out", first,
               "--student", "layers:1", "--max-steps", "4", "--report-to", "tensorboard")
    assert proc.returncode == 0, proc.stderr
    assert tensorboard_scalars(first / "runs").keys() == expected_scalars(first).keys()
    # --teacher, --task and --data are required flags: the file gives them
    proc = cli("distill", "task", "--config", first / "run_options.json", "--out", again)
    assert proc.returncode == 0, proc.stderr
    assert (again / "metrics.jsonl").read_bytes() == (first / "metrics.jsonl").read_bytes()


def test_a_run_that_fails_is_marked_failed_in_mlflow(base, sst, tmp_path):
    out = tmp_path / "ft"
    proc = cli("finetune", "--model", base, "--data", sst, "--out", out, *FINETUNE[:-3], "--lr", "1e9",
               "--no-progress", "--precision", "fp32", "--report-to", "mlflow")
    one_line(proc, "training stopped: the loss became nan")
    run, metrics = mlflow_run(out / "mlruns")
    assert run.info.status == "FAILED"
    # what was logged up to the failure, as in metrics.jsonl (the NaN loss included: compared as JSON, NaN == NaN)
    assert json.dumps(metrics, sort_keys=True) == json.dumps(expected_scalars(out), sort_keys=True)
