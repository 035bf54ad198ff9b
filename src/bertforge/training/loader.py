"""`ResumableLoader`: a deterministic, shardable, resumable batch iterator; `BackgroundBatches` runs it ahead in a
background thread so that collation and masking overlap the training step."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from bertforge.errors import BertforgeError
from bertforge.device import pin

# Length grouping sorts inside chunks of this many batches: big enough to cut padding, small enough to stay random.
_GROUP_CHUNK_BATCHES = 50


class ResumableLoader:
    """Iterate over `dataset` in batches, one epoch per `iter()`, resumable mid-epoch.

    * The order of epoch `e` is a permutation drawn from `(seed, e)` only, so it never depends on history.
    * Batches are formed globally, then rank `r` of `world_size` takes batches `r, r + W, ...`; every rank gets
      the same number of batches (the tail is dropped with `drop_last`, else padded by reusing the first batches),
      which DDP needs to stay in lock-step.
    * `state_dict()` is `{"epoch", "position"}` (batches of this rank already handed out); `load_state_dict`
      resumes at the exact next batch.
    * At the start of each epoch `dataset.set_epoch(epoch)` and `collate_fn.set_epoch(epoch)` are called when they
      exist (dynamic masking that reseeds per epoch stays reproducible).
    * `group_by_length`: a sequence of per-example lengths, a callable `item -> length`, or True (uses
      `len(item["input_ids"])`). Examples are sorted by length inside chunks of 50 batches and the batches are
      shuffled, which cuts padding for fine-tuning.
    * If the dataset has `__getitems__(indices)` (the torch convention), a batch is fetched with one call.
    """

    def __init__(
        self,
        dataset: Sequence,
        batch_size: int,
        collate_fn: Callable[[list], Any] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        group_by_length: Sequence[int] | Callable[[Any], int] | bool | None = None,
    ) -> None:
        if batch_size <= 0:
            raise BertforgeError(f"ResumableLoader.batch_size: must be positive, got {batch_size}")
        if world_size <= 0 or not 0 <= rank < world_size:
            raise BertforgeError(f"ResumableLoader: invalid rank {rank} for world_size {world_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.lengths = self._resolve_lengths(group_by_length)
        self.epoch = 0
        self.position = 0
        self._cache: tuple[int, list[np.ndarray]] | None = None  # (epoch, this rank's batches)

    # ---- state -------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of `epoch` (for callers that manage epochs themselves)."""
        self.epoch, self.position = int(epoch), 0

    # ---- ordering ----------------------------------------------------------------------------------------------
    def _resolve_lengths(self, group_by_length) -> np.ndarray | None:
        if group_by_length is None or group_by_length is False:
            return None
        if group_by_length is True:
            lengths = [len(self.dataset[i]["input_ids"]) for i in range(len(self.dataset))]
        elif callable(group_by_length):
            lengths = [group_by_length(self.dataset[i]) for i in range(len(self.dataset))]
        else:
            lengths = list(group_by_length)
        if len(lengths) != len(self.dataset):
            raise BertforgeError(
                f"ResumableLoader.group_by_length: {len(lengths)} lengths for a dataset of {len(self.dataset)}"
            )
        return np.asarray(lengths, dtype=np.int64)

    def _global_batches(self, epoch: int) -> list[np.ndarray]:
        """All batches of `epoch` across ranks, in order."""
        n = len(self.dataset)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        bs = self.batch_size
        if self.lengths is None:
            return [order[i : i + bs] for i in range(0, n, bs)]
        batches: list[np.ndarray] = []
        chunk = bs * _GROUP_CHUNK_BATCHES
        for start in range(0, n, chunk):
            idx = order[start : start + chunk]
            # stable sort, longest first, so ties keep the random order
            idx = idx[np.argsort(-self.lengths[idx], kind="stable")]
            batches.extend(idx[i : i + bs] for i in range(0, len(idx), bs))
        if self.drop_last:  # a short batch may sit in the middle after sorting; drop it like any tail batch
            batches = [b for b in batches if len(b) == bs]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The indices of every batch of `epoch` across ranks, in order (a function of the seed and epoch alone)."""
        return [b.tolist() for b in self._global_batches(epoch)]

    def _rank_batches(self, epoch: int) -> list[np.ndarray]:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        batches = self._global_batches(epoch)
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches = batches[:-1]
        w = self.world_size
        if batches and len(batches) % w:
            if self.drop_last:
                batches = batches[: len(batches) - len(batches) % w]
            else:  # pad by reusing the first batches so every rank steps the same number of times
                batches = batches + [batches[i % len(batches)] for i in range(w - len(batches) % w)]
        mine = batches[self.rank :: w]
        self._cache = (epoch, mine)
        return mine

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return len(self._rank_batches(self.epoch))

    # ---- iteration ---------------------------------------------------------------------------------------------
    def _fetch(self, indices: np.ndarray) -> Any:
        idx = indices.tolist()
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(idx) if getitems is not None else [self.dataset[i] for i in idx]
        return self.collate_fn(items)

    def __iter__(self):
        """Yield the rest of the current epoch, then advance to the next epoch."""
        batches = self._rank_batches(self.epoch)
        if self.position >= len(batches):  # resumed exactly at an epoch boundary
            self.epoch, self.position = self.epoch + 1, 0
            batches = self._rank_batches(self.epoch)
        for obj in (self.dataset, self.collate_fn):
            set_epoch = getattr(obj, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)
        while self.position < len(batches):
            indices = batches[self.position]
            # advance before yielding: a checkpoint taken while this batch is in use must resume at the next one
            self.position += 1
            yield self._fetch(indices)
        self.epoch, self.position = self.epoch + 1, 0

    def batch_indices(self, epoch: int | None = None) -> list[list[int]]:
        """This rank's batches of `epoch` (default: current) as index lists; for inspection and tests."""
        return [b.tolist() for b in self._rank_batches(self.epoch if epoch is None else epoch)]


class BackgroundBatches:
    """The batches of `loader`, epoch after epoch, prepared up to `depth` ahead in a background thread.

    Collation and dynamic masking (numpy) and pinning then overlap the model's step, since torch releases the GIL
    in its kernels. The batch order is the loader's own: every collator here draws its randomness from
    (seed, epoch, index), never from a global generator, so a run is the same with or without the thread.
    `next()` returns `(batch, state)`, `state` being the loader's `state_dict()` just after that batch: what a
    checkpoint must record, since the loader itself has run ahead. `close()` stops the thread and rewinds the
    loader to the last batch handed out. An error in the thread is raised by the `next()` that would have
    received its batch. `pin_memory`: page-locked batches for non-blocking copies to a GPU.
    """

    def __init__(self, loader: Iterable, depth: int = 2, pin_memory: bool = False) -> None:
        if depth < 1:
            raise BertforgeError(f"BackgroundBatches.depth: must be >= 1, got {depth}")
        self.loader = loader
        self.state: dict | None = loader.state_dict() if hasattr(loader, "state_dict") else None
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pin_memory,), name="bertforge-batches", daemon=True)
        self._thread.start()

    def _run(self, pin_memory: bool) -> None:
        try:
            while not self._stop.is_set():
                empty = True
                for batch in self.loader:
                    empty = False
                    state = self.loader.state_dict() if hasattr(self.loader, "state_dict") else None
                    if not self._put((pin(batch) if pin_memory else batch, state, None)):
                        return
                if empty:
                    raise BertforgeError("train_loader yielded no batches (dataset smaller than one batch?)")
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._put((None, None, exc))

    def _put(self, item: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> "BackgroundBatches":
        return self

    def __next__(self) -> tuple[Any, dict | None]:
        batch, state, exc = self._queue.get()
        if exc is not None:
            self.close()
            raise exc
        self.state = state
        return batch, state

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self.state is not None and hasattr(self.loader, "load_state_dict"):
            self.loader.load_state_dict(self.state)


class InlineBatches(BackgroundBatches):
    """`BackgroundBatches` without the thread (prefetch 0): each batch is made when it is asked for."""

    def __init__(self, loader: Iterable) -> None:  # noqa: super-init-not-called - no thread, no queue
        self.loader, self._it = loader, None
        self.state = loader.state_dict() if hasattr(loader, "state_dict") else None

    def __next__(self) -> tuple[Any, dict | None]:
        for _ in range(2):  # the end of an epoch: the next iter() starts the following one
            if self._it is None:
                self._it = iter(self.loader)
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = None
                continue
            self.state = self.loader.state_dict() if hasattr(self.loader, "state_dict") else None
            return batch, self.state
        raise BertforgeError("train_loader yielded no batches (dataset smaller than one batch?)")

    def close(self) -> None:
        self._it = None


class _BatchJobs(torch.utils.data.Dataset):
    """What a worker process does with a key (epoch, position): that batch of a `ResumableLoader`, made by the
    loader's own `_fetch` after the epoch's `set_epoch` calls. An error comes back as the value (raised by the
    main process as it is: one line, not torch's wrapped worker traceback)."""

    def __init__(self, loader: ResumableLoader):
        self.loader, self.epoch = loader, None

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, position = key
        try:
            if epoch != self.epoch:  # this worker's first batch of the epoch: reseed as the loader's iter() does
                for obj in (self.loader.dataset, self.loader.collate_fn):
                    if callable(getattr(obj, "set_epoch", None)):
                        obj.set_epoch(epoch)
                self.epoch = epoch
            return self.loader._fetch(self.loader._rank_batches(epoch)[position]), None, key
        except Exception as exc:  # noqa: BLE001 - handed to the main process, raised there
            return None, exc, key

    def __len__(self) -> int:  # the keys come from the sampler; DataLoader only asks
        return len(self.loader)


class WorkerBatches(BackgroundBatches):
    """The batches of a `ResumableLoader` made by `workers` processes (torch DataLoader workers), `depth` each
    ahead, handed out in the loader's order: the same batches as inline, for any number of workers (each batch
    depends only on (seed, epoch, its indices)). Processes, unlike the one thread, are not bound by the GIL:
    collation, masking and tokenisation run on as many cores. `next()` and `close()` as `BackgroundBatches`."""

    def __init__(self, loader: ResumableLoader, workers: int, depth: int = 2,  # noqa: super-init-not-called
                 pin_memory: bool = False) -> None:
        if workers < 1:
            raise BertforgeError(f"loader workers: must be >= 1, got {workers}")
        self.loader, self.state = loader, loader.state_dict()
        if not len(loader):
            raise BertforgeError("train_loader yielded no batches (dataset smaller than one batch?)")
        self._pool = torch.utils.data.DataLoader(
            _BatchJobs(loader), batch_size=None, sampler=self._keys(dict(self.state)), num_workers=workers,
            collate_fn=_identity, pin_memory=pin_memory, prefetch_factor=max(1, depth),
            multiprocessing_context="fork" if "fork" in _start_methods() else None)
        self._it = iter(self._pool)

    def _keys(self, state: dict) -> Iterable[tuple[int, int]]:
        def keys():
            epoch, position = state["epoch"], state["position"]
            while True:
                n = len(self.loader._rank_batches(epoch))
                if position >= n:
                    epoch, position = epoch + 1, 0
                    continue
                yield epoch, position
                position += 1
        return keys()

    def __next__(self) -> tuple[Any, dict | None]:
        batch, exc, (epoch, position) = next(self._it)
        if exc is not None:
            self.close()
            raise exc
        self.state = {"epoch": epoch, "position": position + 1}  # as the loader's own state after that batch
        return batch, self.state

    def close(self) -> None:
        if self._it is None:
            return
        shutdown = getattr(self._it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._it = None
        self.loader.load_state_dict(self.state)


def _identity(x: Any) -> Any:
    return x


def _start_methods() -> list[str]:
    import multiprocessing

    return multiprocessing.get_all_start_methods()


def batch_stream(loader: Iterable, prefetch: int, pin_memory: bool = False, workers: int = 0) -> BackgroundBatches:
    """`(batch, loader state after it)` pairs, epoch after epoch: made by `workers` processes (a `ResumableLoader`
    only), `prefetch` ahead in a thread, or inline."""
    if workers and isinstance(loader, ResumableLoader):
        return WorkerBatches(loader, workers, max(prefetch, 1), pin_memory)
    return BackgroundBatches(loader, prefetch, pin_memory) if prefetch else InlineBatches(loader)


def count_tokens(batch: Any, sync: bool = True) -> int | torch.Tensor:
    """Non-padding tokens (attention_mask.sum()), else input_ids.numel(), else the batch size. `sync=False`: the
    mask's sum stays a tensor on the batch's device (no host synchronisation; the Trainer reads it when it logs)."""
    if isinstance(batch, Mapping):
        for key, count in (("attention_mask", lambda t: t.sum()), ("input_ids", lambda t: t.numel())):
            t = batch.get(key)
            if isinstance(t, torch.Tensor):
                n = count(t)
                return n if not sync and isinstance(n, torch.Tensor) else int(n)
        for t in batch.values():
            if isinstance(t, torch.Tensor) and t.ndim > 0:
                return int(t.shape[0])
    return 0
