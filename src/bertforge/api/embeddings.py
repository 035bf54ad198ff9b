"""Sentence embeddings: `embed` texts to vectors, `train_sentence_encoder` (fine-tune a bi-encoder on pairs),
`evaluate_sentence_encoder` (STS correlation, retrieval recall and MRR).

    vectors = bertforge.embed("sentence-transformers/all-MiniLM-L6-v2", ["A man plays a guitar.", "A cat sleeps."])
    vectors.shape                                   # (2, 384), float32, in input order

A model is a folder (sentence-transformers layout, or a plain encoder: mean pooling), a Hub id, or a
`SentenceEncoder` already loaded (then used where it is, unless `device` is given).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.api.inputs import device_for, model_name, placed, placement, read_texts, trackers
from bertforge.api.results import SentenceEncoderResult
from bertforge.config.arguments import (BOOL, COUNT, DATA, DEVICE, EPOCHS, MODEL, PATH, POSITIVE, SEED, STEPS, TEXT,
                                        check_args, maybe)
from bertforge.errors import ArgumentError, BertforgeError


def load_sentence_encoder(model: Any, *, pooling: Any = None, device: str | None = None, compile: bool = False,
                          revision: str | None = None, flag: str = "--model"):
    """A `SentenceEncoder` from a folder or Hub id (with `pooling` instead of its own: mean, cls, max,
    mean_sqrt_len) on `device` (default: auto); a loaded one as it is (moved to `device` when given)."""
    from bertforge.embedding import SentenceEncoder

    check_args(locals(), model=MODEL, device=maybe(DEVICE), compile=maybe(BOOL), revision=maybe(TEXT))
    if isinstance(model, SentenceEncoder):
        if pooling is not None:
            raise BertforgeError("pooling: give it with a model folder or Hub id; a loaded SentenceEncoder keeps its "
                                 "own modules")
        return placed(model, device, compile, flag)
    name = model_name(model, revision)
    encoder = SentenceEncoder.from_pretrained(name, pooling=pooling)
    return placed(encoder, device or "auto", compile, f"{flag} {name}")


def embed(model: Any, texts: Any, *, text_col: Any = None, data_split: str | None = None,
          data_config: str | None = None, batch_size: int = 32, device: str | None = None, precision: str = "fp32",
          pooling: Any = None, normalize: bool | None = None, compile: bool = False, progress: bool = False,
          revision: str | None = None):
    """Vectors of `texts`, a float32 numpy array [N, dim], row i for input row i (an empty text is embedded as
    "", a text longer than the model's max_seq_length is truncated).

    `texts`: a list of strings; or a file (one text a line; or a table: its `text_col`), a saved or Hub dataset (its
    `data_split` / `data_config`), a DataFrame, pyarrow Table or datasets Dataset. `precision`: fp32 (exact),
    bf16, fp16 (GPU only), int8 (CPU only). `normalize`: True / False forces L2 normalisation on / off (None: the
    model's own choice). `compile`: torch.compile the encoder."""
    check_args(locals(), model=MODEL, texts=DATA, text_col=maybe(TEXT), data_split=maybe(TEXT),
               data_config=maybe(TEXT), batch_size=COUNT, device=maybe(DEVICE), precision=TEXT,
               normalize=maybe(BOOL), compile=maybe(BOOL), progress=BOOL, revision=maybe(TEXT))
    where = None  # a loaded model without a device stays where it is, in the precision asked for
    if device is not None or not _loaded(model):
        where = placement(device, precision)  # a missing GPU or a precision it cannot run: before any reading
    from bertforge.model.folder import check_runtime

    model = model_name(model, revision)  # a name resolved once, before any reading
    check_runtime(model)  # an exported model without onnxruntime: one line before any reading
    rows = read_texts(texts, text_col, split=data_split, config=data_config)
    encoder = load_sentence_encoder(model, pooling=pooling, device=where, compile=compile)
    return encoder.encode(rows, batch_size=batch_size, precision=precision, normalize=normalize, progress=progress,
                          precision_checked=where is not None)


def _loaded(model: Any) -> bool:
    return hasattr(model, "encode") and hasattr(model, "fingerprint")


def train_sentence_encoder(model: Any, train: Any, *, out: Any, loss: str = "cosine", eval: Any = None,
                           text_col: Any = None, text_pair_col: Any = None, label_col: Any = None,
                           data_config: str | None = None, epochs: float = 1.0, max_steps: int | None = None,
                           batch_size: int = 16, lr: float = 2e-5, pooling: Any = None, seed: int = 0,
                           device: str = "auto", precision: str = "fp32", compile: bool | None = None,
                           progress: bool = True, report_to: Any = None, logging_dir: Any = None,
                           overwrite: bool = False, revision: str | None = None) -> SentenceEncoderResult:
    """Fine-tune a bi-encoder with `loss` (cosine: scored pairs; softmax: NLI pairs; triplet: anchor / positive /
    negative; mnrl: pairs with in-batch negatives) and save it to `out` in the sentence-transformers layout.

    `train`: pairs in any layout docs/embeddings.md lists (a file, a saved or Hub dataset: its train split, data in
    memory); `eval`: scored pairs whose STS correlation is measured before and after training (a saved or Hub
    dataset: its dev split). A loaded `SentenceEncoder` is trained in place."""
    check_args(locals(), model=MODEL, train=DATA, out=PATH, loss=TEXT, eval=maybe(DATA), text_col=maybe(TEXT),
               text_pair_col=maybe(TEXT), label_col=maybe(TEXT), data_config=maybe(TEXT), epochs=EPOCHS,
               max_steps=maybe(STEPS), batch_size=COUNT, lr=POSITIVE, seed=SEED, device=DEVICE, precision=TEXT,
               compile=maybe(BOOL), progress=BOOL, overwrite=BOOL, revision=maybe(TEXT))
    from bertforge.embedding.data import read_examples
    from bertforge.embedding.train import fit
    from bertforge.io.rundir import claim_output_dir
    from bertforge.io.tables import single_source

    tracked = trackers(report_to, logging_dir)  # a missing tracker library: one line before any work
    device_for(device, precision, ("fp32", "bf16"))
    with claim_output_dir(out, resume=False, overwrite=overwrite, what="--out", resume_flag=None):
        encoder = load_sentence_encoder(model, pooling=pooling, device=device, revision=revision)
        columns = (text_col, text_pair_col, label_col)
        dataset = read_examples(single_source(train, "train", data_config), *columns)
        eval_set = read_examples(single_source(eval, "dev", data_config), *columns) if eval is not None else None
        before = None
        if eval_set:
            from bertforge.embedding.evaluate import evaluate_sts  # scipy: only with an evaluation set
            before = evaluate_sts(encoder, eval_set)
        history = fit(encoder, dataset, out, loss=loss, epochs=epochs, batch_size=batch_size, lr=lr,
                      max_steps=max_steps, seed=seed, progress=progress, device=device, precision=precision,
                      compile=compile, **tracked)
    record: dict[str, Any] = {"out": str(out), "examples": len(dataset), "loss": loss}
    after: dict[str, float] = {}
    if eval_set:
        after = evaluate_sts(encoder, eval_set)
        record.update(sts_before=before, sts_after=after)
    return SentenceEncoderResult(Path(out), after, history, record, model=encoder, loss=loss,
                                 examples=len(dataset), sts_before=before)


def evaluate_sentence_encoder(model: Any, *, sts: Any = None, queries: Any = None, passages: Any = None,
                              relevant: Any = None, squad: Any = None, limit: int | None = None,
                              text_col: Any = None, text_pair_col: Any = None, label_col: Any = None,
                              data_split: str | None = None, data_config: str | None = None, batch_size: int = 32,
                              device: str | None = None, precision: str = "fp32", pooling: Any = None,
                              progress: bool = False, revision: str | None = None) -> dict[str, Any]:
    """How well a sentence encoder scores, as a dict: give one of
      * `sts`: scored pairs (STS-benchmark layout, GLUE STS-B, any table with sentence1 / sentence2 / score, data in
        memory): {"task": "sts", "file", "spearman", "pearson", "n"} of cosine against the gold scores;
      * `squad`: a SQuAD v1.1 json whose questions retrieve their paragraphs, or `queries` and `passages` (lists
        of strings or files of one a line) with `relevant` (per query, the set of relevant passage rows, or a
        file of comma-separated rows a line): {"task": "retrieval", "recall@1", ..., "mrr@10", "queries",
        "passages"}.
    `limit`: the first N pairs or queries only."""
    check_args(locals(), model=MODEL, sts=maybe(DATA), queries=maybe(DATA), passages=maybe(DATA),
               relevant=maybe(DATA), squad=maybe(DATA), limit=maybe(COUNT), text_col=maybe(TEXT),
               text_pair_col=maybe(TEXT), label_col=maybe(TEXT), data_split=maybe(TEXT), data_config=maybe(TEXT),
               batch_size=COUNT, device=maybe(DEVICE), precision=TEXT, progress=BOOL, revision=maybe(TEXT))
    from bertforge.embedding.data import Dataset, read_examples, read_squad_retrieval
    from bertforge.embedding.evaluate import evaluate_retrieval, evaluate_sts
    from bertforge.io.tables import single_source, source_name

    if sum(x is not None for x in (sts, squad, queries)) != 1:
        raise ArgumentError("sts, squad, queries: give exactly one of them (queries with passages and relevant)")
    if device is not None or not _loaded(model):
        device_for(device, precision)
    opts = dict(batch_size=batch_size, precision=precision, progress=progress)
    encoder = load_sentence_encoder(model, pooling=pooling, device=device, revision=revision)
    if sts is not None:
        data = read_examples(single_source(sts, data_split, data_config), text_col, text_pair_col, label_col)
        if limit:
            data = Dataset(data.examples[:limit], data.kind)
        return {"task": "sts", "file": source_name(sts), **evaluate_sts(encoder, data, **opts)}
    if squad is not None:
        questions, texts, rows = read_squad_retrieval(squad)
    else:
        if passages is None or relevant is None:
            raise ArgumentError("queries: give passages and relevant with it")
        questions, texts = read_texts(queries, what="queries"), read_texts(passages, what="passages")
        rows = relevant_rows(relevant, len(texts))
        if len(rows) != len(questions):
            raise BertforgeError(f"{source_name(relevant)}: {len(rows)} lines for {len(questions)} queries")
    if limit:
        questions, rows = questions[:limit], rows[:limit]
    return {"task": "retrieval", **evaluate_retrieval(encoder, questions, texts, rows, **opts)}


def relevant_rows(relevant: Any, n_passages: int) -> list[set[int]]:
    """Per query, the set of relevant passage rows (0-based): as given (a list of sets or lists), or read from a
    file with one line per query of comma-separated rows."""
    if not isinstance(relevant, (str, Path)):
        rows = [set(r) for r in relevant]
        where = lambda no: f"relevant[{no - 1}]"  # noqa: E731
    else:
        rows, where = [], lambda no: f"{relevant}:{no}"  # noqa: E731
        for no, line in enumerate(read_texts(relevant, what="--qrels"), 1):
            try:
                rows.append({int(x) for x in line.replace(" ", "").split(",") if x})
            except ValueError:
                raise BertforgeError(f"{where(no)}: expected comma-separated passage row numbers") from None
    for no, found in enumerate(rows, 1):
        if any(not isinstance(r, int) or not 0 <= r < n_passages for r in found):
            raise BertforgeError(f"{where(no)}: passage row out of range 0..{n_passages - 1}")
    return rows
