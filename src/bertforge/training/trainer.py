"""`Trainer`: the one training loop (AdamW, warm-up + decay schedules, accumulation, bf16, checkpoints, resume, DDP)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.autograd.graph import increment_version
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from bertforge.errors import BertforgeError
from bertforge.training import distributed as D
from bertforge.training.config import TrainConfig
from bertforge.device import (compile_by_default, compile_module, configure_matmul, loader_workers, move_model,
                              oom_error, resolve_device, to_device, uncompile)
from bertforge.training.loader import BackgroundBatches, batch_stream, count_tokens
from bertforge.training.optim import build_optimizer, build_schedule
from bertforge.training.state import (
    STATE_FILE,
    CheckpointDir,
    atomic_write_dir,
    capture_rng,
    default_load_fn,
    default_save_fn,
    plot_curves,
    readable_checkpoint,
    restore_rng,
    set_seed,
)
from bertforge.training.log_window import LogWindow
from bertforge.training.reporting import Reporter, open_reporters

log = logging.getLogger("bertforge.train")

SaveFn = Callable[[nn.Module, Path], None]
EvalFn = Callable[[nn.Module], Mapping[str, float]]


class NonFiniteLoss(BertforgeError):
    """The training loss became NaN or infinite: the run stops (the weights are already ruined)."""

    def __init__(self, value: float, step: int):
        self.value, self.step = value, step
        super().__init__(f"training stopped: the loss became {value} at step {step}; the learning rate is probably "
                         f"too high for this model (try a lower --lr), or reduced precision overflowed (try "
                         f"--precision fp32)")


class Trainer:
    """Train `model` on `train_loader` as configured by `TrainConfig`; see docs/architecture.md.

    `model(**batch)` returns a dict with "loss" (scalar) and optional scalar extras (averaged and logged).
    `eval_fn(model) -> {name: float}` runs (rank 0, eval mode, no_grad) every `eval_every` steps and at the end.
    `save_fn(model, dir)` / `load_fn(model, dir)` write/read the model part of a checkpoint (default:
    model.safetensors). The trainer adds trainer_state.pt. `train()` returns the metric history: the records of
    metrics.jsonl (training lines and `{"step", "split": "eval", ...}` lines), training lines also carrying their
    timing (`tokens_per_s`, `elapsed_s`), which goes to speed.jsonl so that metrics.jsonl holds only what the seed
    determines. `tokens_seen` and `train_seconds` count every segment of a resumed run.
    """

    def __init__(
        self,
        model: nn.Module,
        train_loader: Iterable,
        config: TrainConfig,
        eval_fn: EvalFn | None = None,
        save_fn: SaveFn | None = None,
        load_fn: SaveFn | None = None,
        device: torch.device | None = None,
    ) -> None:
        """`device`: where the caller already resolved `config.device` (its one resolution per call; a distributed
        run's ranks resolve their own)."""
        cfg = self.cfg = config
        if cfg.best_metric is not None and eval_fn is None:
            raise BertforgeError("TrainConfig.best_metric: set, but no eval_fn was given to Trainer")
        self.rank, self.world_size, local_rank = D.distributed_context()
        # the caller's device, unless each rank of a distributed run takes its own GPU
        self.device = device if device is not None and self.world_size == 1 else resolve_device(cfg.device,
                                                                                                local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.matmul_note = configure_matmul(self.device)  # TF32 on CUDA: said in the run header
        self._owns_process_group = D.init_distributed(self.device)
        self.is_main = self.rank == 0
        self.model = move_model(model, self.device, "training")  # the bare module: what save_fn / eval_fn see
        self.ddp_model: nn.Module = self.model
        if D.is_distributed():
            self.ddp_model = DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=cfg.ddp_find_unused_parameters,
            )
        self.loader = train_loader
        self.eval_fn, self.save_fn = eval_fn, save_fn or default_save_fn
        self.load_fn, self.out_dir = load_fn or default_load_fn, Path(cfg.out_dir)
        self.checkpoints = CheckpointDir(self.out_dir / "checkpoints", cfg.keep_checkpoints)
        if getattr(train_loader, "world_size", self.world_size) != self.world_size:
            log.warning("train_loader was built for world_size %s but %d processes run: build it with "
                        "rank/world_size from distributed_context()", train_loader.world_size, self.world_size)
        if not hasattr(train_loader, "state_dict"):
            log.warning("train_loader has no state_dict(): a resumed run will not see the same batches")

        self.total_steps = self._total_steps()
        self.optimizer = build_optimizer(self.model, cfg, self.device)
        self._params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.schedule = build_schedule(cfg, self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.schedule)

        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.tokens_seen = 0  # non-padding tokens trained on, all ranks, all segments (logged windows)
        self.segments = 1  # invocations of train() this run took (1 + resumes)
        self.train_seconds = 0.0  # wall time of train(), all segments; set when it returns
        self._elapsed_before = 0.0  # wall time of earlier (interrupted) runs
        self._step_time = [0.0, 0]  # sum and count of measured step times, first step of each run excluded
        self._last_saved = self._last_eval = -1
        self._stop = False
        self._window = LogWindow(self.device)

    # ---- setup -------------------------------------------------------------------------------------------------
    def _total_steps(self) -> int | None:
        cfg = self.cfg
        if cfg.max_steps is not None:
            return cfg.max_steps
        if cfg.num_epochs is not None:
            try:
                per_epoch = len(self.loader)  # type: ignore[arg-type]
            except TypeError:
                raise BertforgeError("TrainConfig.num_epochs: train_loader has no len(); give max_steps") from None
            if per_epoch == 0:
                raise BertforgeError("train_loader: no batches per epoch (dataset smaller than one batch?)")
            return max(1, math.ceil(cfg.num_epochs * per_epoch / cfg.grad_accum))
        return None  # time budget only: horizon estimated while training

    @property
    def best_dir(self) -> Path:
        return self.out_dir / "best"

    def _resume_dir(self) -> Path | None:
        resume = self.cfg.resume
        if resume is False or resume is None:
            return None
        if resume is True:
            found = self.checkpoints.latest()
            if found is None:
                log.warning("resume=True but no checkpoint under %s: starting fresh", self.checkpoints.root)
            return found
        path = Path(resume)
        if (path / "latest").is_file() or path.name == "checkpoints":  # a checkpoints/ root was given
            found = CheckpointDir(path, None).latest()
            if found is None:
                raise BertforgeError(f"{path}: no complete checkpoint to resume from")
            return found
        if not (path / STATE_FILE).is_file():
            raise BertforgeError(f"TrainConfig.resume: {path} is not a checkpoint directory (no {STATE_FILE})")
        return path

    def _load_checkpoint(self, directory: Path) -> None:
        directory, state = readable_checkpoint(self.checkpoints, directory, lambda d: self.load_fn(self.model, d),
                                               fall_back=self.cfg.resume is True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.total_steps is not None:  # a changed max_steps/num_epochs is the user's intent: honour it
            self.schedule.total = self.total_steps
        if state.get("loader") is not None and hasattr(self.loader, "load_state_dict"):
            if state["world_size"] != self.world_size:
                log.warning("resuming a %d-process run with %d processes: data order changes",
                            state["world_size"], self.world_size)
            self.loader.load_state_dict(state["loader"])
        self.step = int(state["step"])
        self.history = list(state["history"])
        self.best_value, self.best_step = state["best"]["value"], state["best"]["step"]
        self._elapsed_before = float(state["elapsed_s"])
        self.tokens_seen = int(state.get("tokens_seen", 0))  # absent in checkpoints of older versions
        self.segments = int(state.get("segments", 1)) + 1
        self._step_time = [float(state["step_time"][0]), int(state["step_time"][1])]
        self._last_saved = self.step
        self._last_eval = max((r["step"] for r in self.history if r.get("split") == "eval"), default=-1)
        per_rank = state["per_rank"]
        mine = per_rank[self.rank] if len(per_rank) == self.world_size else per_rank[0]
        restore_rng(mine["rng"])
        self._window.load_state_dict(mine["window"])
        if self.is_main:
            log.info("resumed from %s at step %d", directory, self.step)

    # ---- the loop ----------------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Run until max_steps / num_epochs / time budget; return the metric history."""
        resume_dir = self._resume_dir()
        if resume_dir is not None:
            self._load_checkpoint(resume_dir)
        else:
            self._claim_out_dir()
            set_seed(self.cfg.seed + self.rank)  # distinct dropout per rank; weights come from rank 0 (DDP)
        if self.cfg.time_budget_s is not None and self._elapsed_before >= self.cfg.time_budget_s:
            self._stop = True  # resumed a run whose budget is already spent
        self._logs: list[Reporter] | None = None
        if self.is_main:  # metrics.jsonl / speed.jsonl, and the trackers of cfg.report_to
            # resumed: metrics.jsonl / speed.jsonl are rewritten to the checkpoint's history
            self._logs = open_reporters(self.out_dir, self.cfg.report_to, self.cfg.logging_dir,
                                        self.step if resume_dir else None, self.history if resume_dir else None)
            self.checkpoints.clean_temp()
        self._batches: BackgroundBatches | None = None
        compile_module(self.model, compile_by_default(self.device, self.cfg.compile))  # in place; undone at the end
        self._run_start = time.perf_counter()
        self._window.start_clock()
        self._first_step_of_run = True
        self._lr_used = self.optimizer.param_groups[0]["lr"]
        show = self.is_main and self.cfg.progress
        if self.total_steps is None:  # a time budget: the bar counts its seconds, a total known now that never moves
            # (a total in steps would be re-estimated from the step times at every step)
            budget = float(self.cfg.time_budget_s)
            self.pbar = tqdm(total=round(budget), initial=min(round(self._elapsed_before), round(budget)),
                             desc="train", unit="s", dynamic_ncols=True, disable=not show,
                             bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]")
        else:
            self.pbar = tqdm(total=self.total_steps, initial=self.step, desc="train", dynamic_ncols=True,
                             disable=not show)
        try:
            while not self._done():
                self._train_step()
                if self.step % self.cfg.log_every == 0:
                    self._log()
                if self.eval_fn is not None and self.cfg.eval_every and self.step % self.cfg.eval_every == 0:
                    self._evaluate()
                if self.cfg.save_every and self.step % self.cfg.save_every == 0:
                    self._save_checkpoint()
            if not self._window.empty:  # a partial logging window is left
                self._log()
            if self.eval_fn is not None and self._last_eval != self.step:
                self._evaluate()
            if self._last_saved != self.step:
                self._save_checkpoint()
            if self.is_main and self.cfg.plot:
                plot_curves(self.history, self.out_dir / "curves.png")
            if self.cfg.load_best_at_end and self.best_step is not None:
                D.barrier()
                self.load_fn(self.model, self.best_dir)
        except torch.cuda.OutOfMemoryError:
            raise oom_error(self.model, self.device, f"training step {self.step + 1}") from None
        finally:
            if self._batches is not None:
                self._batches.close()  # rewinds the loader to the last batch trained on
            uncompile(self.model)  # a compiled forward is bound to this module: never leave it behind
            self.train_seconds = self._elapsed()
            self.pbar.close()
            for f in self._logs or ():
                f.close()
        if self._owns_process_group:
            D.barrier()
            torch.distributed.destroy_process_group()
        return self.history

    def _claim_out_dir(self) -> None:
        """A fresh run must not mix its checkpoints with an earlier run's (pruning and `latest` would interleave)."""
        if not self.checkpoints.steps():
            return
        if not self.cfg.overwrite:
            raise BertforgeError(f"{self.checkpoints.root}: holds checkpoints of an earlier run; set resume=True to "
                                 "continue it, or overwrite=True to start over")
        if self.is_main:
            log.warning("overwrite=True: removing earlier checkpoints in %s", self.checkpoints.root)
            shutil.rmtree(self.checkpoints.root)
            shutil.rmtree(self.best_dir, ignore_errors=True)
        D.barrier()

    def _done(self) -> bool:
        return self._stop or (self.total_steps is not None and self.step >= self.total_steps)

    def _next_batch(self) -> Any:
        if self._batches is None:  # made ahead (worker processes, or a thread), pinned for a GPU's non-blocking copy
            self._batches = batch_stream(self.loader, self.cfg.prefetch, self.device.type == "cuda",
                                         loader_workers(self.device, self.cfg.loader_workers))
        return next(self._batches)[0]

    def _loader_position(self) -> dict | None:
        """The loader's state after the last batch trained on (the loader itself may have run ahead)."""
        if self._batches is not None:
            return self._batches.state
        return self.loader.state_dict() if hasattr(self.loader, "state_dict") else None

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16")

    def _train_step(self) -> None:
        cfg, t0 = self.cfg, time.perf_counter()
        self.ddp_model.train()
        for micro in range(cfg.grad_accum):
            batch = self._next_batch()
            if not isinstance(batch, Mapping):
                raise BertforgeError(f"train_loader: batches must be dicts of model inputs, got {type(batch).__name__}")
            batch = to_device(batch, self.device)
            tokens = count_tokens(batch, sync=False)  # a device tensor: read only at logging steps
            # DDP all-reduces gradients in backward; skip it on all but the last micro-step
            sync = micro == cfg.grad_accum - 1 or self.ddp_model is self.model
            with contextlib.nullcontext() if sync else self.ddp_model.no_sync():
                with self._autocast():
                    out = self.ddp_model(**batch)
                if not isinstance(out, Mapping) or out.get("loss") is None:
                    raise BertforgeError("model output has no 'loss' (does the batch carry labels?)")
                (out["loss"].float() / cfg.grad_accum).backward()
            self._window.add(out, tokens)
            self._window.watch_loss(out["loss"], self.step + 1)
        if cfg.max_grad_norm is not None:
            self._window.add_grad_norm(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
        self._lr_used = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        if self.optimizer.defaults.get("fused"):  # the fused kernel leaves version counters alone; caches keyed on
            increment_version(self._params)        # them (embed's inference copy) must see the update
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._update_horizon(time.perf_counter() - t0)
        self.scheduler.step()
        if self.total_steps is None:
            self.pbar.update(max(0.0, min(self._elapsed(), self.pbar.total) - self.pbar.n))
        else:
            self.pbar.update(1)

    def _update_horizon(self, step_seconds: float) -> None:
        """Time budget: stop before the next step would overrun, and keep the LR horizon on the budget.

        The horizon is re-estimated every step as `step + remaining / mean_step_time`, the mean excluding the first
        (warm-up-heavy) step of each run. Time spent in eval/checkpoints is not in the mean but eats the remaining
        time, so the estimate shrinks when they happen and the LR still reaches ~0 when the budget runs out.
        """
        if self._first_step_of_run:  # lazy init and cold caches: a provisional estimate only, not in the mean
            self._first_step_of_run = False
        else:
            self._step_time[0] += step_seconds
            self._step_time[1] += 1
        budget = self.cfg.time_budget_s
        if budget is None:
            return
        mean = self._step_time[0] / self._step_time[1] if self._step_time[1] else step_seconds
        remaining = budget - self._elapsed()
        stop, horizon = float(remaining < mean), self.step + max(0.0, remaining) / max(mean, 1e-9)
        if D.is_distributed():  # every rank must stop at the same step, same LR: rank 0's decision (a host sync)
            decision = torch.tensor([stop, horizon], dtype=torch.float64, device=self.device)
            stop, horizon = D.broadcast_tensor(decision).tolist()
        self._stop = bool(stop)
        if self.total_steps is None:
            self.schedule.set_total(max(int(horizon), self.step))

    def _elapsed(self) -> float:
        return self._elapsed_before + time.perf_counter() - self._run_start

    # ---- logging -----------------------------------------------------------------------------------------------
    def _log(self) -> None:
        totals = self._window.reduce(self.world_size, self.cfg.grad_accum)  # every rank: an all-reduce
        self.tokens_seen += totals.tokens
        record: dict[str, Any] = {"step": self.step, "split": "train"}
        epoch = self._epoch()
        if epoch is not None:
            record["epoch"] = round(epoch, 4)
        record.update(totals.means, lr=self._lr_used)
        # timing: in the history and speed.jsonl, never in metrics.jsonl (see _record)
        record["tokens_per_s"] = totals.tokens / max(totals.seconds, 1e-9)
        record["elapsed_s"] = round(self._elapsed(), 3)
        self._record(record)
        if "loss" in record and not math.isfinite(record["loss"]):
            # every rank sees the all-reduced sum, so all stop together; a rank whose own losses were finite
            # names the logging step
            raise NonFiniteLoss(record["loss"], totals.first_nonfinite or self.step)
        self.pbar.set_postfix(**({"step": self.step} if self.total_steps is None else {}),
                              loss=f"{record['loss']:.4f}" if "loss" in record else "-",
                              lr=f"{record['lr']:.2e}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
        log.info(json.dumps(record))

    def _record(self, record: dict[str, Any]) -> None:
        """Append to the history; rank 0 hands it to each reporter (metrics.jsonl: what the seed determines, two
        identical runs write identical files; speed.jsonl: the timing; the trackers of cfg.report_to)."""
        self.history.append(record)
        for reporter in self._logs or ():
            reporter.write(record)

    def _epoch(self) -> float | None:
        state = self._loader_position() or {}
        epoch = state.get("epoch", getattr(self.loader, "epoch", None))
        if epoch is None:
            return None
        try:
            return epoch + state.get("position", 0) / max(1, len(self.loader))  # type: ignore[arg-type]
        except TypeError:
            return float(epoch)

    # ---- evaluation --------------------------------------------------------------------------------------------
    def _evaluate(self) -> None:
        metrics: dict[str, float] | None = None
        if self.is_main:
            self.model.eval()
            with torch.no_grad(), self._autocast():
                raw = self.eval_fn(self.model)  # type: ignore[misc]
            self.model.train()
            if not isinstance(raw, Mapping):
                raise BertforgeError(f"eval_fn must return a dict of floats, got {type(raw).__name__}")
            metrics = {k: float(v) for k, v in raw.items()}
        metrics = D.broadcast_object(metrics)
        self._last_eval = self.step
        record = {"step": self.step, "split": "eval", **metrics}
        self._record(record)
        if self.is_main:
            # a log line, beside the progress bar on stderr: stdout stays the verb's result (JSON for some)
            self.pbar.write("eval step %d: %s" % (self.step, ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())),
                            file=sys.stderr)
        key = self.cfg.best_metric
        if key is None:
            return
        if key not in metrics:
            raise BertforgeError(f"TrainConfig.best_metric: {key!r} not among eval metrics {sorted(metrics)}")
        value = metrics[key]
        better = self.best_value is None or (value > self.best_value if self.cfg.greater_is_better
                                             else value < self.best_value)
        if better:
            self.best_value, self.best_step = value, self.step
            if self.is_main:
                def write(tmp: Path) -> None:
                    self.save_fn(self.model, tmp)
                    (tmp / "best_metrics.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
                atomic_write_dir(self.best_dir, write)
            D.barrier()

    # ---- checkpoints -------------------------------------------------------------------------------------------
    def _save_checkpoint(self) -> None:
        per_rank = D.all_gather_object({"rng": capture_rng(), "window": self._window.state_dict()})
        if self.is_main:
            state = {
                "step": self.step,
                "loader": self._loader_position(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "per_rank": per_rank,
                "history": self.history,
                "best": {"value": self.best_value, "step": self.best_step},
                "elapsed_s": self._elapsed(),
                "tokens_seen": self.tokens_seen,
                "segments": self.segments,
                "step_time": list(self._step_time),
                "world_size": self.world_size,
                "config": json.loads(json.dumps(dataclasses.asdict(self.cfg), default=str)),
            }

            def write(tmp: Path) -> None:
                self.save_fn(self.model, tmp)
                torch.save(state, tmp / STATE_FILE)

            self.checkpoints.save(self.step, write)
        self._last_saved = self.step
        D.barrier()  # nobody runs ahead (or reads the checkpoint) before it is complete
