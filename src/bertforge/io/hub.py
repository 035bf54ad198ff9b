"""Model names as users type them: a local folder, or a model id on the Hugging Face Hub.

`resolve_model_path(name, revision)` turns what a user gave (`--model`, `--teacher`, `--init-from`, a model to
serve, a `from_pretrained` argument) into a local path before anything in it is read:

  * a path that exists is itself (a revision is then refused: it names a version of a Hub model); a folder whose
    name is written as a Hub id (`acme/fr`) is read with a notice naming it, and `hf://acme/fr` means the Hub;
  * otherwise a Hub id (`owner/name`, or a legacy `name`) is a snapshot folder from `huggingface_hub`, at `revision`
    (a branch, tag or commit; default: main). Online it downloads what bertforge reads (config, safetensors
    weights, tokenizer and sentence-transformers files; never pickled weights), with the token from `HF_TOKEN`
    for private or gated models; offline (`HF_HUB_OFFLINE=1`, or the Hub out of reach) it takes the snapshot
    from the local cache (`HF_HOME`, `HF_HUB_CACHE`), as transformers does;
  * anything else, or an id missing from the cache while offline, is one line naming the flag.

huggingface_hub is installed with `tokenizers`; it is imported only when a name is no local path.
"""
from __future__ import annotations

import os
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.io.read import warn

# The files a model folder may need (config, safetensors weights, tokenizers, sentence-transformers modules); a
# repository's pickled, TensorFlow, Flax and ONNX weights are not downloaded.
HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model")
# Written before a name, it means the Hub even where a local folder has that name ("hf://acme/fr").
HUB_PREFIX = "hf://"
# Names ending so are files the user meant, never Hub ids.
_FILE_ENDINGS = (".onnx", ".json", ".git", ".safetensors")


def looks_like_hub_id(name: str, suffixes: tuple[str, ...] = ()) -> bool:
    """Whether `name` (not an existing path) could be a Hub id rather than a mistyped path: the Hub's own rule
    (`huggingface_hub.utils.validate_repo_id`: `owner/name` or a legacy `name`, ASCII letters, digits, '-', '_' and
    '.', no '--' or '..', neither starting nor ending with '-' or '.', 96 characters at most), and no file
    suffix (.onnx, .json, ...; and `suffixes`, the data files' for a dataset)."""
    if not name or not name.isascii() or name.lower().endswith(_FILE_ENDINGS + tuple(suffixes)):
        return False
    return hub_id_problem(name) is None


def hub_id_problem(name: str) -> str | None:
    """Why the Hub would refuse `name` as an id (huggingface_hub's own words, one line), or None."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not name.isascii():
        return "a Hub id is ASCII letters, digits, '-', '_' and '.'"
    try:
        validate_repo_id(name)
    except HFValidationError as err:
        return " ".join(str(err).split())
    return None


def shadows_hub_id(name: str | Path) -> bool:
    """Whether `name`, an existing path, is written as a Hub id (`owner/name`, no ./ or / before it): a folder
    there is read instead of the Hub model of that id."""
    return (isinstance(name, str) and name.count("/") == 1 and not name.startswith((".", "/", "~"))
            and looks_like_hub_id(name) and os.path.lexists(name))


def named(flag: str, name: str | Path) -> str:
    """How a message names what the user gave: "--model X" (or "--model NAME=X" for `serve`, "X" for a
    positional argument)."""
    return f"{flag}{name}" if flag.endswith("=") or not flag else f"{flag} {name}"


def resolve_model_path(name: str | Path, revision: str | None = None, flag: str = "--model") -> Path:
    """The local folder (or .onnx file) `name` stands for: itself when it exists, else the Hub snapshot of the id
    at `revision`; one line naming `flag` when it is neither."""
    if isinstance(name, str) and name.startswith(HUB_PREFIX):
        model_id = name[len(HUB_PREFIX):]
        why = hub_id_problem(model_id) if model_id else "no id after it"
        if why:
            raise BertforgeError(f"{named(flag, name)}: not a Hugging Face Hub id ({why})")
        return hub_snapshot(model_id, revision, flag, shown=name)
    path = Path(name).expanduser()
    if os.path.lexists(path):
        if revision is not None:
            raise _revision_on_a_path(name, revision, flag)
        if shadows_hub_id(name):
            warn(f"{named(flag, name)}: read from the local folder {path.resolve()}, not the Hugging Face Hub model "
                 f"of that id (write {HUB_PREFIX}{name} for the Hub)")
        return path
    if isinstance(name, str) and looks_like_hub_id(name):
        return hub_snapshot(name, revision, flag)
    if isinstance(name, str) and name.count("/") == 1 and not name.startswith((".", "/", "~")) \
            and (why := hub_id_problem(name)):
        raise BertforgeError(f"{named(flag, name)}: no such folder, and not a Hugging Face Hub id ({why})")
    raise BertforgeError(f"{named(flag, name)}: model directory not found")


def _revision_on_a_path(name: str | Path, revision: str, flag: str) -> BertforgeError:
    if shadows_hub_id(name):
        return BertforgeError(f"{named(flag, name)}: --revision {revision} names a version of a Hugging Face Hub "
                              f"model, but a local folder of that name shadows the id; write {HUB_PREFIX}{name} to "
                              "read it from the Hub")
    return BertforgeError(f"{named(flag, name)}: --revision {revision} names a version of a Hugging Face Hub "
                          "model, but this is a local path")


def resolve_model_option(name: str | Path, revision: str | None = None, flag: str = "--model") -> Path:
    """`resolve_model_path` for a verb's model options, where one `revision` (the command's --revision) may be meant
    for another of them: it applies to a Hub id and is ignored for a local path."""
    local = os.path.lexists(Path(name).expanduser())
    if local and revision is not None and shadows_hub_id(name):  # the revision was surely meant for the Hub
        raise _revision_on_a_path(name, revision, flag)
    return resolve_model_path(name, None if local else revision, flag)


class ResolvedModel(str):
    """A model name already turned into its local path (`resolve_once`): every later opener takes it as it is, so a
    name is resolved (and a Hub id looked up) once per call. A string (a command-line option stays one) that also
    answers as the Path it names (`/`, `.name`, `.is_dir()`, ...), as the resolved paths before it did."""

    def __truediv__(self, other: "str | os.PathLike") -> Path:
        return Path(self) / other

    def __getattr__(self, attr: str):
        return getattr(Path(self), attr)


def resolve_once(name: "str | Path", revision: str | None = None, flag: str = "--model") -> ResolvedModel:
    """`resolve_model_option`, once: a name resolved before is returned as it is."""
    if isinstance(name, ResolvedModel):
        return name
    return ResolvedModel(resolve_model_option(name, revision, flag))


def hub_snapshot(model_id: str, revision: str | None = None, flag: str = "--model", shown: str = "") -> Path:
    """The folder of `model_id` at `revision` from huggingface_hub: downloaded, or from the cache when offline."""
    from huggingface_hub import constants, errors, snapshot_download

    where = named(flag, shown or model_id) + (f" (revision {revision})" if revision else "")
    try:
        folder = snapshot_download(model_id, revision=revision, allow_patterns=list(HUB_FILES),
                                   token=os.environ.get("HF_TOKEN") or None)
    except errors.RevisionNotFoundError:
        raise BertforgeError(f"{where}: the Hugging Face Hub has no such revision") from None
    except (errors.GatedRepoError, errors.RepositoryNotFoundError):  # (gated is a kind of not-found: first)
        raise BertforgeError(f"{where}: not a local folder, and not a model on the Hugging Face Hub that this "
                             "token may read (a private or gated model needs HF_TOKEN)") from None
    except errors.LocalEntryNotFoundError:
        why = "offline (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "the Hugging Face Hub cannot be reached"
        lead = "" if shown else "no such folder, and "  # hf://ID asked for the Hub alone
        raise BertforgeError(f"{where}: {lead}not in the Hugging Face cache ({constants.HF_HUB_CACHE}) while {why}") \
            from None
    except errors.HfHubHTTPError as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BertforgeError(f"{where}: the Hugging Face Hub refused the download ({reason})") from None
    except OSError as err:  # a cache that cannot be written (read-only HF_HOME, a full disk)
        raise BertforgeError(f"{where}: cannot download into the Hugging Face cache ({err.strerror or err})") from None
    return Path(folder)
