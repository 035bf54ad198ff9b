"""RAG checkpoints in transformers' layout: one folder, one `config.json` with `model_type: rag` holding the
question encoder's and the generator's configs as sub-dictionaries, one `model.safetensors` whose tensors are the
two models' own, under `rag.question_encoder.` and `rag.generator.` (what RagTokenForGeneration /
RagSequenceForGeneration.from_pretrained read, and save_pretrained writes).

The question encoder inside is a DPR question encoder (`question_encoder.bert_model.*`); a plain BERT-layout encoder
(`bert.*` or bare `embeddings.*`) is renamed into that layout when a RAG folder is assembled, so a retriever
bertforge trained can go in unchanged. The generator is any encoder-decoder bertforge builds (BART, T5).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.config.hf import config_from_dict, read_config_json
from bertforge.errors import BertforgeError
from bertforge.io.write import ensure_dir, write_json
from bertforge.model.checkpoint import load_pretrained, read_state_dict, write_tensors

RAG_MODEL_TYPE = "rag"
QUESTION_PREFIX, GENERATOR_PREFIX = "rag.question_encoder.", "rag.generator."
DPR_QUESTION_BODY = "question_encoder.bert_model."
RAG_QUESTION_ARCHITECTURE = "DPRQuestionEncoder"  # the class transformers' RAG builds its question encoder with
# what transformers' RagConfig carries besides the two sub-configs (its defaults), kept when a folder is rewritten
RAG_DEFAULTS: dict[str, Any] = {
    "n_docs": 5, "max_combined_length": 300, "title_sep": " / ", "doc_sep": " // ", "retrieval_vector_size": 768,
    "retrieval_batch_size": 8, "do_marginalize": False, "reduce_loss": False, "label_smoothing": 0.0,
    "do_deduplication": True, "exclude_bos_score": False, "output_retrieved": False, "use_cache": True,
    "is_encoder_decoder": True,
}


@dataclass
class RagFolder:
    path: Path
    config: dict[str, Any]                 # the whole config.json
    question_encoder: dict[str, Any]       # its sub-config (a DPR config)
    generator: dict[str, Any]              # its sub-config (bart, t5, ...)
    tensors: dict[str, torch.Tensor]       # every tensor, with the file's names
    source: Path

    @property
    def n_docs(self) -> int:
        return int(self.config.get("n_docs", RAG_DEFAULTS["n_docs"]))

    def part(self, prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix):]: v for k, v in self.tensors.items() if k.startswith(prefix)}


def is_rag_folder(path: str | Path) -> bool:
    p = Path(path)
    if not (p / "config.json").is_file():
        return False
    return read_config_json(p).get("model_type") == RAG_MODEL_TYPE


def open_rag_folder(path: str | Path) -> RagFolder:
    """A RAG folder read and checked: both sub-configs present, and tensors for both models (a folder missing its
    generator is one line saying so)."""
    path = Path(path)
    config = read_config_json(path)
    if config.get("model_type") != RAG_MODEL_TYPE:
        raise BertforgeError(f"{path / 'config.json'}: model_type is {config.get('model_type')!r}, not a RAG "
                             f"model ({RAG_MODEL_TYPE!r})")
    for part in ("question_encoder", "generator"):
        if not isinstance(config.get(part), dict) or "model_type" not in config[part]:
            raise BertforgeError(f"{path / 'config.json'}: a RAG config needs its {part!r} config (a dictionary "
                                 "with a model_type)")
    tensors, source = read_state_dict(path)
    for prefix, what in ((GENERATOR_PREFIX, "generator"), (QUESTION_PREFIX, "question encoder")):
        if not any(k.startswith(prefix) for k in tensors):
            raise BertforgeError(f"{source}: the RAG folder holds no {what} weights (no tensor named {prefix}*)")
    return RagFolder(path, config, config["question_encoder"], config["generator"], tensors, source)


def load_generator(folder: RagFolder, attn_implementation: str = "sdpa"):
    """The folder's generator as bertforge's encoder-decoder."""
    from bertforge.families import ENCODER_DECODER
    from bertforge.model import Seq2SeqLM

    cfg = config_from_dict(folder.generator, f"{folder.path / 'config.json'} (generator)")
    if cfg.stack != ENCODER_DECODER:
        raise BertforgeError(f"{folder.path / 'config.json'}: the generator is a {cfg.model_type} model, not an "
                             "encoder-decoder")
    model = Seq2SeqLM(cfg, attn_implementation)
    state = folder.part(GENERATOR_PREFIX)
    if "lm_head.weight" in state:
        model.untie_output()
    load_pretrained(model, folder.path, tensors=(state, folder.source))
    return model.eval()


def question_encoder_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A question encoder's tensors in DPR's layout (`question_encoder.bert_model.*`): kept as they are, or renamed
    from a BERT-layout file (`bert.*`, or bare `embeddings.*` / `encoder.*`; a pooler is dropped: DPR reads [CLS])."""
    if any(k.startswith(DPR_QUESTION_BODY) for k in state):
        return {k: v for k, v in state.items() if k.startswith(DPR_QUESTION_BODY) or k.startswith("question_encoder.")}
    out = {}
    for k, v in state.items():
        bare = k[len("bert."):] if k.startswith("bert.") else k
        if bare.startswith(("embeddings.", "encoder.")):
            out[DPR_QUESTION_BODY + bare] = v
    if not out:
        raise BertforgeError("the question encoder's weights are neither in DPR's layout "
                             f"({DPR_QUESTION_BODY}*) nor in BERT's (bert.* / embeddings.*)")
    return out


def _question_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A BERT-layout encoder's config.json as the DPR config transformers' RAG expects."""
    from bertforge.families import FAMILIES

    question = next(f for f in FAMILIES.values() if f.architecture == RAG_QUESTION_ARCHITECTURE)
    out = {k: v for k, v in cfg.items() if k not in ("architectures", "bertforge_task", "auto_map")}
    out.update(model_type=question.model_type, architectures=[RAG_QUESTION_ARCHITECTURE])
    out.setdefault("projection_dim", 0)
    return out


def save_rag_folder(out: str | Path, question_encoder: str | Path, generator: str | Path, *,
                    settings: dict[str, Any] | None = None) -> Path:
    """Assemble a RAG folder from a question-encoder folder and a generator folder (both in transformers' own
    layouts). `settings` (n_docs, max_combined_length, ...) override transformers' defaults. Written atomically
    file by file; the tokenizers stay in their own folders (`question_encoder_tokenizer/`, `generator_tokenizer/`,
    as transformers' RagTokenizer saves them) when present."""
    out = ensure_dir(out, "out")
    q_cfg, g_cfg = read_config_json(question_encoder), read_config_json(generator)
    # transformers' RAG-Sequence reads generator.bos_token_id, which a T5 config may lack: say "none" explicitly
    g_cfg.setdefault("bos_token_id", None)
    q_state, _ = read_state_dict(question_encoder)
    g_state, _ = read_state_dict(generator)
    tensors = {QUESTION_PREFIX + k: v for k, v in question_encoder_tensors(q_state).items()}
    tensors.update({GENERATOR_PREFIX + k: v for k, v in g_state.items()})
    unknown = set(settings or {}) - set(RAG_DEFAULTS)
    if unknown:
        raise BertforgeError(f"settings: unknown RAG setting(s) {', '.join(sorted(unknown))} (known: "
                             f"{', '.join(sorted(RAG_DEFAULTS))})")
    config = {**RAG_DEFAULTS, **(settings or {}), "model_type": RAG_MODEL_TYPE,
              "question_encoder": _question_config(q_cfg), "generator": g_cfg}
    write_tensors(out / "model.safetensors", {k: v.contiguous() for k, v in tensors.items()})
    write_json(out / "config.json", config, sort_keys=True)
    for src, name in ((question_encoder, "question_encoder_tokenizer"), (generator, "generator_tokenizer")):
        _copy_tokenizer(Path(src), out / name)
    return out


def _copy_tokenizer(src: Path, dst: Path) -> None:
    from bertforge.io.write import atomic_write

    files = [f for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                         "vocab.json", "merges.txt", "spiece.model") if (src / f).is_file()]
    if not files:
        return
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        data = (src / f).read_bytes()
        atomic_write(dst / f, lambda tmp, data=data: Path(tmp).write_bytes(data))
