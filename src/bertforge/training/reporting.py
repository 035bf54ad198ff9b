"""Where a run's records go: metrics.jsonl / speed.jsonl always, TensorBoard and MLflow on request.

One interface, `Reporter.write(record)` / `close()`, fed by `Trainer._record` with every training and eval record.
`JsonlReporter` writes metrics.jsonl (only what the seed determines) and speed.jsonl (timing); the trackers get the
same numbers under the same steps, through their own writers: `TensorBoardReporter` (torch's `SummaryWriter`,
events under OUT/runs or `logging_dir`) and `MlflowReporter` (`MlflowClient`: `MLFLOW_TRACKING_URI`, else a file
store under OUT/mlruns; the run's recorded options, OUT/run_options.json, become the run's params). A tracker's
scalar is named `SPLIT/KEY` ("train/loss", "eval/accuracy"): the split and key of its metrics.jsonl line.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.write import note_written
from bertforge.training.state import TIMING_KEYS, MetricsLog, metrics_part, speed_part

REPORT_TO = ("tensorboard", "mlflow")
# what each tracker imports, and the extra that installs it (named in the one line when it is missing)
_NEEDS = {"tensorboard": ("tensorboard", "torch.utils.tensorboard", "tensorboard"),
          "mlflow": ("mlflow", "mlflow.tracking", "mlflow")}
MLFLOW_PARAM_MAX = 6000  # MLflow refuses longer param values


def parse_report_to(values: Sequence[str] | str | None, flag: str = "--report-to") -> tuple[str, ...]:
    """The trackers named by `--report-to` (repeated and/or comma-separated, like transformers' report_to; "none"
    drops those named before it), each imported now, before any work: a missing library is one line naming its
    extra."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    chosen: list[str] = []
    for name in (n.strip().lower() for v in values for n in str(v).split(",") if n.strip()):
        if name == "none":  # clears the trackers named before it (a --config file's too)
            chosen = []
        elif name not in REPORT_TO:
            raise BertforgeError(f"{flag}: unknown tracker {name!r} (choose from tensorboard, mlflow, none; "
                                 "several comma-separated)")
        elif name not in chosen:
            chosen.append(name)
    for name in chosen:
        package, module, extra = _NEEDS[name]
        try:  # imported, not only found: a broken install is also one line now rather than a traceback later
            importlib.import_module(module)
        except ImportError:
            raise BertforgeError(f"{flag} {name} needs the {package} package: "
                                 f"pip install 'bertforge[{extra}]'") from None
    if "mlflow" in chosen:
        check_mlflow_store()
    return tuple(chosen)


# MLflow's HTTP client retries a server that does not answer for minutes (7 retries, exponential back-off): the
# check below asks once, briefly; the run then retries a little (the user's own settings win, if any).
_MLFLOW_CHECK = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
_MLFLOW_RUN = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
_checked_stores: set[str] = set()


def is_file_store(uri: str) -> bool:
    """A local folder (a path, or a file: URI): MLflow's file store."""
    return uri.startswith("file:") or "://" not in uri


def check_mlflow_store() -> None:
    """Before any work, the store a run will log to: MLFLOW_TRACKING_URI unset is a file store in OUT/mlruns; a
    folder (a path or a file: URI) is a file store there, which MLflow 3 keeps behind MLFLOW_ALLOW_FILE_STORE
    (set for it here); any other URI is asked for one experiment, once and briefly. A store that cannot be used
    is one line naming MLFLOW_TRACKING_URI and why."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri or uri in _checked_stores:
        return
    if is_file_store(uri):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    saved = {k: os.environ.get(k) for k in _MLFLOW_CHECK}
    os.environ.update({k: v for k, v in _MLFLOW_CHECK.items() if saved[k] is None})
    try:
        from mlflow.tracking import MlflowClient

        MlflowClient(uri).search_experiments(max_results=1)
    except Exception as err:  # noqa: BLE001 -- whatever the store's failure, the run cannot log to it
        reason = " ".join(str(err).split())[:300] or type(err).__name__
        raise BertforgeError(f"MLFLOW_TRACKING_URI {uri}: the MLflow store cannot be used ({reason}); start the "
                             "server or fix the URI, or unset it to log into OUT/mlruns") from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
    for key, value in _MLFLOW_RUN.items():
        os.environ.setdefault(key, value)
    _checked_stores.add(uri)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl record's numbers as tracker scalars: {"SPLIT/KEY": value} (no timing, no step)."""
    split = record.get("split", "train")
    return {f"{split}/{k}": float(v) for k, v in record.items()
            if k not in ("step", "split") and k not in TIMING_KEYS and isinstance(v, (int, float))
            and not isinstance(v, bool)}


class Reporter:
    """Receives every record of a run (rank 0 only) in order; `close` once at the end (also after a failure)."""

    def write(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class JsonlReporter(Reporter):
    """metrics.jsonl (what the seed determines: two identical runs write identical files) and speed.jsonl (the
    timing of training records, under the same step). A resume rewrites both to the checkpoint's history
    (`known`), so no line logged after the checkpoint is logged twice."""

    def __init__(self, out_dir: Path, resumed_at: int | None, known: list[dict[str, Any]] | None = None):
        self.metrics = MetricsLog(out_dir / "metrics.jsonl", resumed_at, known, metrics_part)
        self.speed = MetricsLog(out_dir / "speed.jsonl", resumed_at, known, speed_part)

    def write(self, record: dict[str, Any]) -> None:
        self.metrics.write(metrics_part(record))
        timing = speed_part(record)
        if timing:
            self.speed.write(timing)

    def close(self) -> None:
        self.metrics.close()
        self.speed.close()


class TensorBoardReporter(Reporter):
    """Scalars through torch.utils.tensorboard's SummaryWriter; a resume purges the earlier events after the
    resumed step (TensorBoard's purge_step), as metrics.jsonl drops its lines."""

    def __init__(self, log_dir: Path, resumed_at: int | None, params: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=None if resumed_at is None else resumed_at + 1)
        if params and resumed_at is None:
            self.writer.add_text("run_options", "    " + json.dumps(params, indent=2).replace("\n", "\n    "))
        self._note_events()

    def write(self, record: dict[str, Any]) -> None:
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, global_step=int(record["step"]))

    def close(self) -> None:
        self.writer.close()
        self._note_events()

    def _note_events(self) -> None:
        """The event files this process writes (events.out.tfevents.TIME.HOST.PID.N) are bertforge's output."""
        for path in self.log_dir.glob(f"events.out.tfevents.*.{os.getpid()}.*"):
            note_written(path)


class MlflowReporter(Reporter):
    """Metrics and params through MlflowClient. The run is tagged with OUT's absolute path, so a resumed run logs
    into the same MLflow run; the experiment is MLFLOW_EXPERIMENT_NAME (default "bertforge")."""

    def __init__(self, out_dir: Path, resumed_at: int | None, params: dict[str, Any]):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.store = None if uri else out_dir / "mlruns"  # a store of its own in OUT: bertforge's output
        known = self._experiment_files()
        if not uri:
            # MLflow 3 keeps its file store behind this switch; a local folder next to the run is what a user
            # without a tracking server wants (point MLFLOW_TRACKING_URI at a server or database otherwise)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (out_dir / "mlruns").resolve().as_uri()
        self.client = MlflowClient(uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "bertforge"
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(name)
        self.experiment = experiment
        # the experiments' meta.yaml that MLflow made for this run (the default one, ours); earlier ones are in the
        # manifest already when this run carries an earlier one's on
        self._made = sorted(self._experiment_files() - known)
        where = str(out_dir.resolve())
        earlier = self.client.search_runs([experiment], f"tags.`bertforge.out` = '{where}'",
                                          order_by=["attributes.start_time DESC"], max_results=1) \
            if resumed_at is not None and "'" not in where else []
        if earlier:
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(experiment, run_name=out_dir.name, tags={"bertforge.out": where})
            self.run_id = run.info.run_id
            self._log_params(params)

    def _log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k.lstrip("-"), (v if isinstance(v, str) else json.dumps(v))[:MLFLOW_PARAM_MAX])
                 for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def write(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(record["step"])
        metrics = [Metric(tag, value, now, step) for tag, value in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        # called from the Trainer's `finally`: an exception on its way out marks the run failed (or killed: ^C)
        error = sys.exc_info()[0]
        status = "FINISHED" if error is None else "KILLED" if issubclass(error, KeyboardInterrupt) else "FAILED"
        self.client.set_terminated(self.run_id, status=status)
        for path in self._written():
            note_written(path)

    def _experiment_files(self) -> set[Path]:
        return set(self.store.glob("*/meta.yaml")) if self.store is not None and self.store.is_dir() else set()

    def _written(self) -> list[Path]:
        """The files of the store in OUT that MLflow wrote for this run, by its file store's layout: the run's
        meta.yaml, one file per metric, param and tag it holds (a key's "/" is a folder), and the experiments' meta.yaml
        made for it. Never the store's folder walked whole: a file the user saved there is not bertforge's."""
        if self.store is None:
            return []
        run = self.client.get_run(self.run_id)
        folder = self.store / str(self.experiment) / self.run_id
        files = [folder / "meta.yaml", *self._made]
        for kind, keys in (("metrics", run.data.metrics), ("params", run.data.params), ("tags", run.data.tags)):
            files += [folder / kind / Path(*key.split("/")) for key in keys]
        return files


def open_reporters(out_dir: Path, report_to: Iterable[str], logging_dir: str | Path | None,
                   resumed_at: int | None, known: list[dict[str, Any]] | None = None) -> list[Reporter]:
    """metrics.jsonl's writer, then one reporter per tracker; the run's options (OUT/run_options.json, written
    when OUT was claimed) are the trackers' params."""
    reporters: list[Reporter] = [JsonlReporter(out_dir, resumed_at, known)]
    names = tuple(report_to)
    if not names:
        return reporters
    parse_report_to(list(names), "TrainConfig.report_to")  # a library missing here is still one line
    params: dict[str, Any] = {}
    recorded = out_dir / "run_options.json"
    if recorded.is_file():
        try:
            params = json.loads(recorded.read_text(encoding="utf-8")).get("options", {})
        except (OSError, ValueError):
            params = {}  # the record is for the trackers' information only: a damaged one is no reason to stop
    for name in names:
        if name == "tensorboard":
            reporters.append(TensorBoardReporter(Path(logging_dir or out_dir / "runs"), resumed_at, params))
        elif name == "mlflow":
            reporters.append(MlflowReporter(out_dir, resumed_at, params))
    return reporters
