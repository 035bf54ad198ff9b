"""Checkpoint directories (atomic write, `latest` pointer, pruning), RNG capture, metrics.jsonl / speed.jsonl and
the curve plot. A failed checkpoint write (a full disk: OSError, or torch's "unexpected pos") is one line naming the
checkpoint, and leaves the previous checkpoint and `latest` as they were."""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write, atomic_write_text, note_written, write_errors

log = logging.getLogger("bertforge.train")

STATE_FILE = "trainer_state.pt"
TIMING_KEYS = ("tokens_per_s", "elapsed_s")  # training-record fields that go to speed.jsonl, not metrics.jsonl
_STEP_DIR = re.compile(r"^step-(\d+)$")


# ---- model part: default save/load -------------------------------------------------------------------------------
def default_save_fn(model: nn.Module, directory: Path) -> None:
    """model.safetensors from the state dict (save_model copes with tied weights, e.g. MLM decoder = embeddings)."""
    from safetensors.torch import save_model

    save_model(model, str(Path(directory) / "model.safetensors"))


def default_load_fn(model: nn.Module, directory: Path) -> None:
    from safetensors.torch import load_model

    path = Path(directory) / "model.safetensors"
    if not path.is_file():
        raise BertforgeError(f"{path}: no model.safetensors in checkpoint (pass the load_fn matching save_fn)")
    load_model(model, str(path))


# ---- atomic directory writes ---------------------------------------------------------------------------------------
def _fsync_tree(directory: Path) -> None:
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(root))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_dir(final: Path, write: Callable[[Path], None]) -> Path:
    """Let `write(tmp)` fill a temp dir next to `final`, fsync it, then rename it into place.

    If `write` raises, the temp dir is removed and any previous `final` is untouched; a failed write (OSError,
    torch's writer errors) becomes one BertforgeError naming the file under `final` ("D/step-40/trainer_state.pt:
    No space left on device") or `final` itself. Replacing an existing `final` moves it aside first (rename
    cannot replace a non-empty dir) and deletes it after the swap.
    """
    final = Path(final)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    try:
        with write_errors(final):
            final.parent.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            try:
                write(tmp)
                _fsync_tree(tmp)
            except OSError as err:  # name the file where it was going, not the temporary directory
                if err.filename and Path(err.filename).is_relative_to(tmp):
                    err.filename = str(final / Path(err.filename).relative_to(tmp))
                raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    note_written(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


# ---- checkpoint directory management -------------------------------------------------------------------------------
class CheckpointDir:
    """`out_dir/checkpoints/step-N/` directories plus a `latest` pointer file naming the newest complete one."""

    def __init__(self, root: Path, keep: int | None):
        self.root = Path(root)
        self.keep = keep

    def steps(self) -> list[tuple[int, Path]]:
        """Complete checkpoints (those holding trainer_state.pt), oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and (p / STATE_FILE).is_file():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        if pointer.is_file():
            name = pointer.read_text(encoding="utf-8", errors="replace").strip()
            target = self.root / name
            if not _STEP_DIR.match(name):  # never followed out of the run ("../../../outside/step-99")
                log.warning("%s names %r, not a checkpoint of this run (step-N); ignored, using the newest "
                            "complete checkpoint here", pointer, name[:80])
            elif (target / STATE_FILE).is_file():
                return target
            else:
                log.warning("%s points at %s, which is incomplete; using the newest complete checkpoint", pointer,
                            target)
        steps = self.steps()
        return steps[-1][1] if steps else None

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        self.clean_temp()
        final = atomic_write_dir(self.root / f"step-{step}", write)
        atomic_write_text(self.root / "latest", final.name + "\n")
        self.prune(keep_also=final)
        return final

    def prune(self, keep_also: Path) -> None:
        if self.keep is None:
            return
        steps = self.steps()
        for _step, path in steps[: max(0, len(steps) - self.keep)]:
            if path != keep_also:
                shutil.rmtree(path, ignore_errors=True)

    def clean_temp(self) -> None:
        """Remove leftovers of interrupted writes (.tmp-*/.old-*)."""
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith((".tmp-", ".old-")) and p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)


def load_trainer_state(directory: Path) -> dict[str, Any]:
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise BertforgeError(f"{path}: not a trainer checkpoint (no {STATE_FILE})")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, OSError) as err:
        # truncated, damaged, or a pickle that weights_only refuses (it never runs): one line, no traceback
        reason = str(err).strip().splitlines()[0].split(". ")[0] if str(err).strip() else type(err).__name__
        if "Weights only load failed" in str(err):
            reason = "holds objects a checkpoint never holds (refused, not loaded)"
        raise BertforgeError(f"{path}: unreadable ({reason[:160]})") from None


def readable_checkpoint(checkpoints: CheckpointDir, directory: Path, load_model: Callable[[Path], None],
                        fall_back: bool) -> tuple[Path, dict[str, Any]]:
    """Read `directory`'s trainer state and model; if either is unreadable (truncated, a refused pickle) and
    `fall_back`, the newest older checkpoint that reads instead, with a one-line warning; one line if none does."""
    m = _STEP_DIR.match(Path(directory).name)
    step = int(m.group(1)) if m else None
    older = [p for s, p in reversed(checkpoints.steps()) if fall_back and step is not None and s < step]
    for i, d in enumerate([Path(directory), *older]):
        try:
            state = load_trainer_state(d)
            load_model(d)
            return d, state
        except (BertforgeError, OSError, SafetensorError) as err:
            reason = str(err).strip().splitlines()[0].split(". ")[0] if str(err).strip() else type(err).__name__
            if i == len(older):
                raise BertforgeError(f"{reason}; no readable checkpoint to resume from in {checkpoints.root} "
                                     "(start over with --overwrite)") from None
            log.warning("%s; resuming from %s instead", reason, older[i])
    raise AssertionError("unreachable")


# ---- RNG state (plain containers so torch.load(weights_only=True) accepts it) ---------------------------------------
def capture_rng() -> dict[str, Any]:
    py_version, py_state, py_gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_kind, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_kind, np.asarray(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ---- metrics.jsonl and curves.png --------------------------------------------------------------------------------
def metrics_part(record: dict[str, Any]) -> dict[str, Any]:
    """A record as metrics.jsonl holds it: what the seed determines, no timing."""
    return {k: v for k, v in record.items() if k not in TIMING_KEYS}


def speed_part(record: dict[str, Any]) -> dict[str, Any] | None:
    """A training record's timing as speed.jsonl holds it (None for a record without timing)."""
    timing = {k: record[k] for k in TIMING_KEYS if k in record}
    return {"step": record["step"], **timing} if timing else None


class MetricsLog:
    """Appends one JSON object per line; on resume, lines after the resumed step are dropped first."""

    def __init__(self, path: Path, resume_step: int | None, known: list[dict[str, Any]] | None = None,
                 part: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda r: r):
        """known: on resume, the records the checkpoint holds (`part` of each: this file's share); the file is
        rewritten to exactly those, so a line logged after the checkpoint (e.g. the final eval of a run killed
        while writing its model) is not logged twice."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            atomic_write_text(self.path, "")
        elif known is not None:
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in map(part, known) if r))
        elif self.path.exists():
            kept = []
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a torn last line from a crash
                    continue
                if rec.get("step", 0) <= resume_step:
                    kept.append(line + "\n")
            atomic_write_text(self.path, "".join(kept))
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        with write_errors(self.path):
            self._f.write(json.dumps(record) + "\n")
            self._f.flush()

    def close(self) -> None:
        self._f.close()


def plot_curves(history: list[dict[str, Any]], path: Path) -> bool:
    """curves.png: training loss, learning rate and each eval metric against step. False if matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    train = [r for r in history if r.get("split", "train") == "train"]
    evals = [r for r in history if r.get("split") == "eval"]
    eval_keys = sorted({k for r in evals for k, v in r.items() if k not in ("step", "split") and _is_num(v)})
    panels = [("loss", train), ("lr", train)] + [(k, evals) for k in eval_keys]
    fig = Figure(figsize=(5 * min(len(panels), 3), 3.5 * ((len(panels) + 2) // 3)))
    FigureCanvasAgg(fig)  # attaches an Agg canvas without touching the global backend
    for i, (key, recs) in enumerate(panels):
        ax = fig.add_subplot((len(panels) + 2) // 3, min(len(panels), 3), i + 1)
        pts = [(r["step"], r[key]) for r in recs if _is_num(r.get(key))]
        if pts:
            ax.plot(*zip(*pts), marker="o" if recs is evals else None, markersize=3)
        ax.set_title(("eval " if recs is evals else "") + key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    return True


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
