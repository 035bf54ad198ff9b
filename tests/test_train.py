"""Tests of the shared training loop on a tiny dropout LM and synthetic data (each run is a few hundred ms)."""

from __future__ import annotations

import errno
import json
import math
import os
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.training import (
    NonFiniteLoss,
    ResumableLoader,
    TrainConfig,
    Trainer,
    WarmupLinearDecay,
    load_trainer_state,
    param_groups,
    parse_duration,
)

VOCAB, DIM, SEQ = 32, 16, 8


class TinyLM(nn.Module):
    """Embedding -> dropout -> LayerNorm -> linear; learns next = (token + 1) % VOCAB."""

    def __init__(self, dropout: float = 0.1, sleep_s: float = 0.0):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.drop = nn.Dropout(dropout)
        self.LayerNorm = nn.LayerNorm(DIM)
        self.hidden = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, VOCAB)
        self.sleep_s = sleep_s
        self.fail_at_call: int | None = None  # simulate a crash on the N-th forward
        self.calls = 0

    def forward(self, input_ids, labels, attention_mask=None):
        self.calls += 1
        if self.fail_at_call is not None and self.calls == self.fail_at_call:
            raise KeyboardInterrupt("simulated interruption")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        h = self.LayerNorm(self.drop(self.emb(input_ids)))
        logits = self.out(torch.tanh(self.hidden(h)))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), labels.reshape(-1))
        accuracy = (logits.argmax(-1) == labels).float().mean()
        return {"loss": loss, "logits": logits, "accuracy": accuracy, "ignored_flag": True}


@pytest.fixture(autouse=True)
def _one_thread():
    # the models are tiny: a thread pool only adds jitter on a shared CPU (and the time-budget test measures time)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_dataset(n: int = 128, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    mask = torch.ones(n, SEQ, dtype=torch.long)
    mask[::2, -2:] = 0  # some padding so tokens = attention_mask.sum() is visible
    return [{"input_ids": ids[i], "labels": (ids[i] + 1) % VOCAB, "attention_mask": mask[i]} for i in range(n)]


def make_model(dropout: float = 0.1, seed: int = 0, **kw) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(dropout, **kw)


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def cfg(out: Path, **kw) -> TrainConfig:
    base = dict(out_dir=out, lr=1e-2, max_steps=20, log_every=1, progress=False, plot=False, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


# ---- end-to-end ------------------------------------------------------------------------------------------------------
def test_loss_falls_and_outputs(tmp_path):
    loader = ResumableLoader(make_dataset(), batch_size=16, seed=1)
    trainer = Trainer(make_model(), loader, cfg(tmp_path, max_steps=60, log_every=5, plot=True))
    history = trainer.train()
    train = [r for r in history if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(5, 61, 5))
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    # metrics.jsonl: only what the seed determines; the timing of the same steps is in speed.jsonl
    records = read_metrics(tmp_path)
    speed = [json.loads(line) for line in (tmp_path / "speed.jsonl").read_text().splitlines()]
    assert [r["step"] for r in speed] == [r["step"] for r in records] == list(range(5, 61, 5))
    merged = [{**r, **{k: v for k, v in s.items() if k != "step"}} for r, s in zip(records, speed)]
    assert merged == json.loads(json.dumps(history))
    for rec, timing in zip(records, speed):
        assert {"step", "loss", "lr", "accuracy", "grad_norm", "epoch"} <= rec.keys()
        assert not {"tokens_per_s", "elapsed_s", "logits", "ignored_flag"} & rec.keys()
        assert timing.keys() == {"step", "tokens_per_s", "elapsed_s"} and timing["tokens_per_s"] > 0
    assert records[-1]["accuracy"] > 0.5
    # tokens come from attention_mask (every other row has 2 padding tokens): count the same 60 batches
    ref, batches = ResumableLoader(make_dataset(), batch_size=16, seed=1), []
    while len(batches) < 60:
        batches.extend(b for _, b in zip(range(60 - len(batches)), ref))
    assert trainer.tokens_seen == sum(int(b["attention_mask"].sum()) for b in batches) < 60 * 16 * SEQ
    assert (tmp_path / "curves.png").stat().st_size > 1000
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-60"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-60"]


class BlowsUp(TinyLM):
    """TinyLM whose loss is NaN (or inf) from its N-th forward on, as a diverged run's is."""

    def __init__(self, at_call: int, value: float):
        super().__init__(dropout=0.0)
        self.at_call, self.value = at_call, value

    def forward(self, input_ids, labels, attention_mask=None):
        out = super().forward(input_ids, labels, attention_mask)
        if self.calls >= self.at_call:
            out["loss"] = out["loss"] * self.value
        return out


@pytest.mark.parametrize("value,grad_accum,at_call,step", [(float("nan"), 1, 7, 7), (float("inf"), 2, 7, 4)])
def test_non_finite_loss_stops_the_run_naming_the_step(tmp_path, value, grad_accum, at_call, step):
    torch.manual_seed(0)
    loader = ResumableLoader(make_dataset(), batch_size=8, seed=1)
    trainer = Trainer(BlowsUp(at_call, value), loader,
                      cfg(tmp_path, max_steps=50, log_every=5, grad_accum=grad_accum))
    with pytest.raises(NonFiniteLoss) as err:
        trainer.train()
    # the first bad step is named exactly, though it is only checked at the next log (step 5 or 10)
    assert err.value.step == step and trainer.step == 5 * ((step + 4) // 5)
    msg = str(err.value)
    assert f"at step {step}" in msg and "--lr" in msg and "fp32" in msg and "\n" not in msg
    assert isinstance(err.value, BertforgeError)  # the CLI prints it as one line and exits 2
    assert not math.isfinite(read_metrics(tmp_path)[-1]["loss"])  # the bad window is logged


def test_schedule_values_match_hf():
    sched = WarmupLinearDecay(total=100, warmup_steps=10)
    expected = {0: 0.0, 5: 0.5, 10: 1.0, 55: 0.5, 91: 0.1, 100: 0.0, 120: 0.0}
    for step, value in expected.items():
        assert sched(step) == pytest.approx(value)
    assert WarmupLinearDecay(total=200, warmup_ratio=0.1).warmup() == 20
    # reference: transformers' BERT schedule on the same optimizer
    from transformers.optimization import get_linear_schedule_with_warmup

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_linear_schedule_with_warmup(opt, num_warmup_steps=7, num_training_steps=50)
    mine = WarmupLinearDecay(total=50, warmup_steps=7)
    for step in range(55):
        assert mine(step) == pytest.approx(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()


def test_logged_lr_follows_schedule(tmp_path):
    loader = ResumableLoader(make_dataset(), batch_size=8)
    Trainer(make_model(), loader, cfg(tmp_path, lr=1e-3, max_steps=20)).train()  # default warm-up: 10% = 2 steps
    lrs = [r["lr"] for r in read_metrics(tmp_path)]
    # the LR logged at step s (1-based) is the one used for that update: schedule(s - 1)
    assert lrs[:4] == pytest.approx([0.0, 5e-4, 1e-3, 1e-3 * 17 / 18])
    assert lrs[-1] == pytest.approx(1e-3 / 18)


def test_weight_decay_groups():
    model = make_model()
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    ids = lambda g: {id(p) for p in g["params"]}  # noqa: E731
    assert ids(decay) == {id(model.emb.weight), id(model.hidden.weight), id(model.out.weight)}
    assert ids(no_decay) == {id(model.LayerNorm.weight), id(model.LayerNorm.bias), id(model.hidden.bias),
                             id(model.out.bias)}
    model.emb.weight.requires_grad_(False)  # frozen parameters are not optimised at all
    assert id(model.emb.weight) not in ids(param_groups(model, 0.01)[0])


def test_cpu_optimizer_is_fused_and_steps_like_the_plain_loop():
    from bertforge.training.optim import build_optimizer

    torch.manual_seed(0)
    model, ref = make_model(), make_model()
    ref.load_state_dict(model.state_dict())
    cfg = TrainConfig(out_dir=Path("unused"), max_steps=3, lr=1e-2, weight_decay=0.01)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    assert opt.defaults["fused"] is True  # one pass per tensor (the single-tensor loop was ~5x slower on MiniLM)
    before = [q.detach().clone() for q in model.parameters()]
    plain = torch.optim.AdamW(param_groups(ref, 0.01), lr=1e-2, betas=cfg.betas, eps=cfg.eps, foreach=False)
    for _ in range(3):
        for m in (model, ref):
            for q in m.parameters():
                q.grad = torch.ones_like(q) * 0.1 + q.detach() * 0.5
        opt.step()
        plain.step()
    for a, b, a0 in zip(model.parameters(), ref.parameters(), before):
        assert not torch.allclose(a, a0) and torch.allclose(a, b, atol=1e-6)


def test_grad_accumulation_matches_big_batch(tmp_path):
    data = make_dataset(64)
    params = []
    for bs, accum in ((8, 1), (4, 2)):
        model = make_model(dropout=0.0)
        loader = ResumableLoader(data, batch_size=bs, shuffle=False)
        conf = cfg(tmp_path / f"bs{bs}", max_steps=3, grad_accum=accum, warmup_steps=0, max_grad_norm=0.5)
        hist = Trainer(model, loader, conf).train()
        params.append([p.detach().clone() for p in model.parameters()])
        assert loader.state_dict() == {"epoch": 0, "position": 24 // bs}
    for a, b in zip(*params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert hist[0]["loss"] > 0


def test_bf16_autocast_trains(tmp_path):
    seen = []

    class Probe(TinyLM):
        def forward(self, **batch):
            out = super().forward(**batch)
            seen.append(out["logits"].dtype)
            return out

    torch.manual_seed(0)
    loader = ResumableLoader(make_dataset(), batch_size=16)
    hist = Trainer(Probe(), loader, cfg(tmp_path, precision="bf16", max_steps=40, log_every=10)).train()
    assert set(seen) == {torch.bfloat16}
    assert all(math.isfinite(r["loss"]) for r in hist)
    assert hist[-1]["loss"] < 0.7 * hist[0]["loss"]


def test_time_budget_stops_and_decays(tmp_path):
    loader = ResumableLoader(make_dataset(), batch_size=8)
    Trainer(make_model(), loader, cfg(tmp_path / "warm", max_steps=2)).train()  # pay torch's lazy init first
    model = make_model(sleep_s=0.02)
    start = time.perf_counter()
    trainer = Trainer(model, loader, cfg(tmp_path, max_steps=None, time_budget_s="1.2s", log_every=1))
    hist = trainer.train()
    wall = time.perf_counter() - start
    steps = hist[-1]["step"]
    lrs = [r["lr"] for r in hist]
    info = f"wall={wall:.2f} steps={steps} lrs={[round(x * 1e3, 2) for x in lrs]}"
    assert wall < 1.2 + 0.8, info  # stops on time (a step is ~25 ms, plus the final checkpoint)
    assert 10 <= steps <= 60, info
    assert trainer.schedule.total == steps  # the horizon closed exactly on the last step
    peak = max(lrs)
    assert peak > 0.5e-2 and lrs[-1] < 0.5 * peak, info  # warmed up, then decayed on the estimated horizon
    assert hist[-1]["elapsed_s"] <= 1.2 + 0.3, info  # at most one (jittery) step past the budget


def test_parse_duration():
    assert parse_duration("30m") == 1800 and parse_duration("90s") == 90 and parse_duration("1h") == 3600
    assert parse_duration("1h30m") == 5400 and parse_duration("2.5h") == 9000 and parse_duration("45") == 45
    for bad in ("", "abc", "10x", "-5", "1h30", True):
        with pytest.raises(BertforgeError):
            parse_duration(bad)
    with pytest.raises(BertforgeError, match="max_steps, num_epochs or time_budget_s"):
        TrainConfig(out_dir="x")


# ---- checkpoints and exact resume ----------------------------------------------------------------------------------
def _resume_cfg(out: Path, **kw) -> TrainConfig:
    return cfg(out, max_steps=40, save_every=20, warmup_steps=5, **kw)


def test_exact_resume_reproduces_losses(tmp_path):
    def run(out: Path, fail_at_call=None, resume=False) -> Trainer:
        model = make_model(dropout=0.3, seed=123 if resume else 0)  # resume must not depend on init
        model.fail_at_call = fail_at_call
        loader = ResumableLoader(make_dataset(60), batch_size=7, seed=5)  # 9 batches/epoch: resume crosses epochs
        trainer = Trainer(model, loader, _resume_cfg(out, resume=resume, log_every=3))
        trainer.train()
        return trainer

    first = run(tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "resumed", fail_at_call=27)  # dies in step 27, after the step-20 checkpoint
    partial = read_metrics(tmp_path / "resumed")
    assert partial[-1]["step"] == 24  # logged past the checkpoint before dying: must be dropped on resume
    second = run(tmp_path / "resumed", resume=True)

    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == [r["step"] for r in straight] == list(range(3, 40, 3)) + [40]
    assert resumed == straight  # exact, not approximate: every loss, accuracy, lr and grad norm
    speed = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "speed.jsonl").read_text().splitlines()]
    assert speed == [r["step"] for r in straight]  # the dropped lines are dropped here too
    # totals over both segments, not the last one's
    assert second.tokens_seen == first.tokens_seen and (second.segments, first.segments) == (2, 1)
    assert second.train_seconds > load_trainer_state(tmp_path / "resumed" / "checkpoints" / "step-20")["elapsed_s"]


def test_trainer_state_is_weights_only_and_complete(tmp_path):
    loader = ResumableLoader(make_dataset(), batch_size=8)
    Trainer(make_model(), loader, cfg(tmp_path, max_steps=6, save_every=2, keep_checkpoints=2)).train()
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.is_dir()) == ["step-4", "step-6"]  # pruned to 2
    state = torch.load(ckpts / "step-6" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 6 and state["loader"] == {"epoch": 0, "position": 6}
    assert {"optimizer", "scheduler", "per_rank", "history", "elapsed_s", "best"} <= state.keys()
    assert {"python", "numpy", "torch"} <= state["per_rank"][0]["rng"].keys()
    assert len(state["history"]) == 6
    assert (ckpts / "step-6" / "model.safetensors").is_file()


DISK_FULL = {  # what a full disk raises while a checkpoint is written, and the one line it must become
    "oserror": (lambda path: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)),
                "checkpoints/step-40/model.safetensors: " + os.strerror(errno.ENOSPC)),
    "torch": (lambda path: RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 1984 vs 1878"),
              "checkpoints/step-40: cannot write: write failed (torch: unexpected pos 1984 vs 1878; is the disk "
              "full?)"),
}


@pytest.mark.parametrize("kind", sorted(DISK_FULL))
def test_crash_during_checkpoint_keeps_previous(tmp_path, kind):
    calls = []
    make_error, message = DISK_FULL[kind]

    def flaky_save(model, directory):
        calls.append(directory)
        (directory / "model.safetensors").write_bytes(b"partial")
        if len(calls) == 2:
            raise make_error(directory / "model.safetensors")
        from safetensors.torch import save_model

        save_model(model, str(directory / "model.safetensors"))

    loader = ResumableLoader(make_dataset(), batch_size=8)
    with pytest.raises(BertforgeError) as err:
        Trainer(make_model(), loader, _resume_cfg(tmp_path), save_fn=flaky_save).train()
    assert str(err.value) == f"{tmp_path}/{message}"  # one line naming the checkpoint (not the temporary dir)
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-20"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-20"]  # no step-40, no temp leftovers
    assert load_trainer_state(ckpts / "step-20")["step"] == 20
    # and the run resumes from it to completion
    loader = ResumableLoader(make_dataset(), batch_size=8)
    hist = Trainer(make_model(), loader, _resume_cfg(tmp_path, resume=True)).train()
    assert hist[-1]["step"] == 40 and (ckpts / "latest").read_text().strip() == "step-40"


def test_resume_errors_and_fresh_start(tmp_path):
    loader = ResumableLoader(make_dataset(), batch_size=8)
    with pytest.raises(BertforgeError, match="not a checkpoint directory"):
        Trainer(make_model(), loader, cfg(tmp_path, resume=tmp_path / "nope")).train()
    hist = Trainer(make_model(), loader, cfg(tmp_path / "fresh", max_steps=3, resume=True)).train()
    assert hist[-1]["step"] == 3  # resume=True with nothing to resume starts fresh
    with pytest.raises(BertforgeError, match="earlier run"):  # a fresh run would mix with the old checkpoints
        Trainer(make_model(), loader, cfg(tmp_path / "fresh", max_steps=2, overwrite=False)).train()
    Trainer(make_model(), loader, cfg(tmp_path / "fresh", max_steps=2)).train()  # default: replace the old run
    assert sorted(p.name for p in (tmp_path / "fresh" / "checkpoints").iterdir()) == ["latest", "step-2"]
    # resuming a finished run does no more steps and keeps its history
    hist = Trainer(make_model(), loader, cfg(tmp_path / "fresh", max_steps=2, resume=True)).train()
    assert [r["step"] for r in hist] == [1, 2] and len(read_metrics(tmp_path / "fresh")) == 2


def test_epochs_eval_and_best_checkpoint(tmp_path):
    data, held_out = make_dataset(48), make_dataset(32, seed=9)
    evals = []

    def eval_fn(model):
        assert not model.training
        batch = {k: torch.stack([d[k] for d in held_out]) for k in held_out[0]}
        out = model(**batch)
        scripted = [0.3, 0.9, 0.5]  # the best is the middle evaluation, not the last
        evals.append(float(out["loss"]))
        return {"loss": float(out["loss"]), "score": scripted[len(evals) - 1]}

    loader = ResumableLoader(data, batch_size=8, group_by_length=[1] * 48)
    conf = cfg(tmp_path, max_steps=None, num_epochs=1.5, eval_every=4, best_metric="score", load_best_at_end=True)
    model = make_model()
    trainer = Trainer(model, loader, conf, eval_fn=eval_fn)
    hist = trainer.train()
    assert trainer.total_steps == 9  # 1.5 epochs of 6 batches
    eval_steps = [r["step"] for r in hist if r["split"] == "eval"]
    assert eval_steps == [4, 8, 9]
    assert trainer.best_step == 8 and trainer.best_value == 0.9
    best = json.loads((tmp_path / "best" / "best_metrics.json").read_text())
    assert best["step"] == 8 and best["score"] == 0.9
    # load_best_at_end put the step-8 weights back: the held-out loss is the one measured at step 8
    model.eval()
    with torch.no_grad():
        batch = {k: torch.stack([d[k] for d in held_out]) for k in held_out[0]}
        assert float(model(**batch)["loss"]) == pytest.approx(evals[1], abs=1e-6)
    with pytest.raises(BertforgeError, match="best_metric"):
        Trainer(make_model(), loader, cfg(tmp_path, best_metric="score"))


# ---- ResumableLoader -----------------------------------------------------------------------------------------------
def _ids(loader: ResumableLoader) -> list[list[int]]:
    return [b.tolist() for b in loader]


def _indexed(n: int) -> list[int]:
    return list(range(n))


def test_loader_deterministic_per_epoch():
    a, b = ResumableLoader(_indexed(50), 8, seed=3), ResumableLoader(_indexed(50), 8, seed=3)
    ea0, ea1 = _ids(a), _ids(a)
    assert ea0 == _ids(b) and ea1 == _ids(b)  # same (seed, epoch) -> same order
    assert ea0 != ea1  # a new permutation every epoch
    assert sorted(sum(ea0, [])) == list(range(50)) and len(ea0) == 7 and len(ea0[-1]) == 2
    assert ea0 != _ids(ResumableLoader(_indexed(50), 8, seed=4))
    assert _ids(ResumableLoader(_indexed(10), 4, shuffle=False)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(_ids(ResumableLoader(_indexed(10), 4, drop_last=True))) == 2


def test_loader_resumes_mid_epoch():
    straight = ResumableLoader(_indexed(30), 4, seed=1)
    expected = _ids(straight)[3:] + _ids(straight)
    live = ResumableLoader(_indexed(30), 4, seed=1)
    it = iter(live)
    for _ in range(3):
        next(it)
    state = live.state_dict()
    assert state == {"epoch": 0, "position": 3}
    fresh = ResumableLoader(_indexed(30), 4, seed=1)
    fresh.load_state_dict(state)
    assert _ids(fresh) + _ids(fresh) == expected
    # resuming exactly at the end of an epoch continues with the next one
    end = ResumableLoader(_indexed(30), 4, seed=1)
    end.load_state_dict({"epoch": 0, "position": 8})
    assert _ids(end) == expected[5:]  # expected[5:] is epoch 1


def test_loader_rank_shards_are_disjoint_and_cover():
    shards = [_ids(ResumableLoader(_indexed(48), 4, seed=2, rank=r, world_size=3)) for r in range(3)]
    flat = [set(sum(s, [])) for s in shards]
    assert all(len(s) == 4 for s in shards)
    assert not (flat[0] & flat[1]) and not (flat[0] & flat[2]) and not (flat[1] & flat[2])
    assert set().union(*flat) == set(range(48))
    # uneven: every rank still takes the same number of batches (DDP lock-step)
    uneven = [len(ResumableLoader(_indexed(50), 4, rank=r, world_size=3)) for r in range(3)]
    assert uneven == [5, 5, 5]
    dropped = [ResumableLoader(_indexed(50), 4, rank=r, world_size=3, drop_last=True) for r in range(3)]
    assert [len(d) for d in dropped] == [4, 4, 4]
    assert all(len(b) == 4 for d in dropped for b in _ids(d))


def test_loader_group_by_length_cuts_padding():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 64, (400,), generator=g).tolist()
    data = [{"input_ids": list(range(n))} for n in lengths]

    def padded(loader):
        return sum(len(b) * max(lengths[i] for i in b) for b in loader.batch_indices())

    plain = ResumableLoader(data, 16, seed=0)
    grouped = ResumableLoader(data, 16, seed=0, group_by_length=True)
    assert sorted(sum(grouped.batch_indices(), [])) == list(range(400))
    assert padded(grouped) < 0.8 * padded(plain)
    assert grouped.batch_indices(0) != grouped.batch_indices(1)  # still shuffled per epoch


def test_loader_calls_set_epoch_and_getitems():
    class DS:
        def __init__(self):
            self.epochs, self.fetches = [], 0

        def __len__(self):
            return 10

        def __getitem__(self, i):
            raise AssertionError("batched __getitems__ should be used")

        def __getitems__(self, idx):
            self.fetches += 1
            return idx

        def set_epoch(self, e):
            self.epochs.append(e)

    ds = DS()
    loader = ResumableLoader(ds, 5, collate_fn=lambda items: items)
    _ids_ = [list(loader), list(loader)]
    assert ds.epochs == [0, 1] and ds.fetches == 4 and len(_ids_[1]) == 2
