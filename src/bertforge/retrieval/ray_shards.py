"""Embedding shards on a Ray cluster: Ray Data maps the shard ids over an actor pool of encoders (`map_batches`,
one shard a batch); each actor loads the model once and builds whole shards with `retrieval.shards.build_shard`, so
the files are the same as a job array's and a killed run resumes the same way. The index folder and the corpus
must be paths every node sees (a shared file system); the driver merges after the last shard.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError


def _ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise BertforgeError("--ray needs ray[data], which is not installed: pip install 'bertforge[ray]'") from None
    return ray


class ShardWorker:
    """A Ray Data actor: one loaded encoder, building the shards whose ids come by."""

    def __init__(self, model: str, pooling: Any, out: str, corpus: Any, num_shards: int, options: dict[str, Any]):
        from bertforge.embedding import SentenceEncoder

        self.encoder = SentenceEncoder.from_pretrained(model, pooling=pooling)
        self.out, self.corpus, self.num_shards, self.options = out, corpus, num_shards, options

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from bertforge.retrieval.shards import build_shard

        built = [build_shard(self.out, self.encoder, self.corpus, int(i), self.num_shards, progress=False,
                             **self.options) for i in batch["shard"]]
        return {"shard": [b.shard_id for b in built], "count": [b.count for b in built],
                "embedded": [b.embedded for b in built]}


def build_shards_on_ray(out: str | Path, model: str | Path, corpus: Any, num_shards: int | None, *,
                        address: str | None = None, workers: int | None = None, pooling: Any = None,
                        options: dict[str, Any] | None = None, progress: bool = False) -> list[dict[str, Any]]:
    """Build shards 0..N-1 of `corpus` under `out` on the Ray cluster at `address` (None or "local": start a local
    one, unless this process is connected already) with `workers` encoder actors (default: one a CPU of the
    cluster, at most N; N by default: one a CPU). Returns one {shard, count, embedded} per shard."""
    ray = _ray()
    if not isinstance(corpus, (str, Path)):
        raise BertforgeError("ray: the corpus must be a path the cluster's nodes can read, not data in memory")
    import logging

    started = False
    if not ray.is_initialized():
        ray.init(address=None if address in (None, "", "local") else address, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.WARNING)
        started = True
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # the shards' own progress is what a user reads
    ray.data.DataContext.get_current().enable_progress_bars = progress
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        num_shards = num_shards or cpus
        workers = max(1, min(num_shards, workers or cpus))
        ds = ray.data.from_items([{"shard": i} for i in range(num_shards)], override_num_blocks=num_shards)
        ds = ds.map_batches(ShardWorker, batch_size=1, concurrency=workers, num_cpus=min(1, cpus / workers),
                            fn_constructor_kwargs={"model": _shared_path(model), "pooling": pooling,
                                                   "out": str(Path(out).resolve()),
                                                   "corpus": _shared_path(corpus),
                                                   "num_shards": num_shards, "options": options or {}})
        return sorted(ds.take_all(), key=lambda r: r["shard"])
    finally:
        if started:
            ray.shutdown()


def _shared_path(name: Any) -> str:
    """A local path made absolute (the actors run elsewhere); a Hub id as it is."""
    return str(Path(name).resolve()) if Path(name).exists() else str(name)
