"""The sharded side of `Index.build` and `Index.merge` (api/index.py stays thin): one shard of a corpus, every shard
in turn, the shards on a Ray cluster, and the merge into one index folder (`bertforge.retrieval.shards`,
`bertforge.retrieval.merge`, `bertforge.retrieval.ray_shards` say how).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bertforge.api.embeddings import load_sentence_encoder
from bertforge.api.inputs import model_name
from bertforge.errors import BertforgeError


def build_sharded(model: Any, passages: Any, out: Any, *, num_shards: int | None, shard_id: int | None,
                  ray: Any, kind: str, passage_options: dict[str, Any], shard_options: dict[str, Any],
                  pooling: Any, device: str | None, compile: bool, revision: str | None, overwrite: bool,
                  progress: bool, environ: bool):
    """A `ShardBuild` when this process builds one shard (and another merges), else the merged index's meta."""
    from bertforge.retrieval.merge import merge_shards
    from bertforge.retrieval.shards import build_shard, shard_plan

    if out is None:
        raise BertforgeError("out: a sharded build writes its shards into the index folder; give one")
    if ray is not None and shard_id is not None:
        raise BertforgeError("ray: Ray builds every shard; drop shard_id")
    env = os.environ if environ else {}
    num_shards, shard_id = shard_plan(num_shards, shard_id, env) if ray is None else (num_shards, None)
    if ray is not None:
        from bertforge.retrieval.ray_shards import build_shards_on_ray

        if not isinstance(model, (str, os.PathLike)):
            raise BertforgeError("model: a Ray build loads the model on every worker; give its folder or Hub id")
        name = model_name(model, revision)
        options = {**shard_options, "passages": passage_options, "overwrite": overwrite}
        built = build_shards_on_ray(out, name, passages, num_shards, address=None if ray is True else ray,
                                    pooling=pooling, options=options, progress=progress)
        return merge_shards(out, kind, num_shards=len(built), overwrite=overwrite, progress=progress)
    if environ and _torchrun(env) and device in (None, "auto") and "LOCAL_RANK" in env:
        import torch

        if torch.cuda.is_available():  # one GPU a rank, as training's ranks take them
            device = f"cuda:{int(env['LOCAL_RANK']) % torch.cuda.device_count()}"
    encoder = load_sentence_encoder(model, pooling=pooling, device=device, compile=compile, revision=revision)
    ids = [shard_id] if shard_id is not None else range(num_shards)
    built = [build_shard(out, encoder, passages, i, num_shards, passages=passage_options, progress=progress,
                         overwrite=overwrite, **shard_options) for i in ids]
    if shard_id is None:
        return merge_shards(out, kind, num_shards=num_shards, fingerprint=encoder.fingerprint(),
                            overwrite=overwrite, progress=progress)
    if environ and _torchrun(env) and num_shards > 1:  # the ranks wait for each other; rank 0 merges
        return _merge_on_rank_zero(out, kind, num_shards, encoder.fingerprint(), overwrite, progress, built[0])
    return built[0]


def _torchrun(env: Any) -> bool:
    return "TORCHELASTIC_RUN_ID" in env or ("MASTER_ADDR" in env and "RANK" in env)


def _merge_on_rank_zero(out, kind, num_shards, fingerprint, overwrite, progress, built):
    import torch

    from bertforge.retrieval.merge import merge_shards
    from bertforge.training.distributed import barrier, init_distributed, is_distributed

    created = init_distributed(torch.device("cpu"))
    try:
        barrier()
        result = built
        if built.shard_id == 0:
            result = merge_shards(out, kind, num_shards=num_shards, fingerprint=fingerprint, overwrite=overwrite,
                                  progress=progress)
        barrier()
        return result
    finally:
        if created and is_distributed():
            import torch.distributed as dist

            dist.destroy_process_group()


def merge(out: Any, kind: str, *, model: Any, num_shards: int | None, pooling: Any, revision: str | None,
          overwrite: bool, progress: bool) -> dict[str, Any]:
    """Merge the shards in `out` into its index (checked against `model` when one is given)."""
    from bertforge.retrieval.merge import merge_shards

    if not Path(out).is_dir():
        raise BertforgeError(f"out {out}: no such folder (no shards to merge)")
    fingerprint = None
    if model is not None:
        fingerprint = load_sentence_encoder(model, pooling=pooling, device="cpu", revision=revision).fingerprint()
    return merge_shards(out, kind, num_shards=num_shards, fingerprint=fingerprint, overwrite=overwrite,
                        progress=progress)
