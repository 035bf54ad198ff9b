"""DDP: two gloo processes under torchrun train a tiny model; this file is also the worker script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


class IndexedDataset:
    """Wraps the synthetic LM examples and records which indices this process fetched."""

    def __init__(self, items):
        self.items, self.seen = items, []

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        self.seen.append(i)
        return self.items[i]


def worker(out_dir: str) -> None:
    sys.path.insert(0, str(HERE))
    from test_train import make_dataset, make_model

    from bertforge.training import ResumableLoader, TrainConfig, Trainer, distributed_context

    rank, world_size, _ = distributed_context()
    data = IndexedDataset(make_dataset(160))
    # 40 batches of 4 per epoch, 20 per rank: 10 steps x accum 2 use exactly one epoch share
    loader = ResumableLoader(data, batch_size=4, seed=7, rank=rank, world_size=world_size)
    model = make_model(dropout=0.1, seed=rank)  # different inits: DDP must broadcast rank 0's weights
    held_out = make_dataset(16, seed=3)

    def eval_fn(m):  # runs on rank 0 only; the result is broadcast so every rank's history matches
        batch = {k: torch.stack([d[k] for d in held_out]) for k in held_out[0]}
        return {"neg_loss": -float(m(**batch)["loss"]), "rank": rank}

    conf = TrainConfig(out_dir=out_dir, lr=2e-2, max_steps=10, warmup_steps=1, grad_accum=2, log_every=1,
                       save_every=5, eval_every=5, best_metric="neg_loss", progress=False, plot=False, device="cpu",
                       prefetch=0)  # `seen` counts fetched examples; background batches would fetch ahead
    history = Trainer(model, loader, conf, eval_fn=eval_fn).train()
    history = [r for r in history if r["split"] == "train"]
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "seen": torch.tensor(data.seen), "losses": torch.tensor([r["loss"] for r in history])},
               Path(out_dir) / f"rank{rank}.pt")


def test_ddp_two_ranks(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(Path(__file__).resolve()), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    seen0, seen1 = set(r0["seen"].tolist()), set(r1["seen"].tolist())
    assert len(seen0) == len(seen1) == 80 and not seen0 & seen1  # each rank its own share of the epoch
    for name, p in r0["params"].items():
        assert torch.equal(p, r1["params"][name]), name  # in sync after 10 steps
    # the logged loss is the all-reduced mean: identical on both ranks, and it fell
    assert torch.equal(r0["losses"], r1["losses"])
    assert r0["losses"][-3:].mean() < 0.85 * r0["losses"][:3].mean()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 11))  # written once (rank 0), not twice
    assert torch.equal(torch.tensor([r["loss"] for r in train]), r0["losses"])
    evals = [r for r in records if r["split"] == "eval"]
    assert [(r["step"], r["rank"]) for r in evals] == [(5, 0), (10, 0)]
    assert (tmp_path / "best" / "model.safetensors").is_file()
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-10"
    state = torch.load(tmp_path / "checkpoints" / "step-10" / "trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["per_rank"]) == 2


if __name__ == "__main__":
    worker(sys.argv[1])
