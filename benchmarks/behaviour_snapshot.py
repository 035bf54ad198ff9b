"""Fingerprints of what `bertforge pretrain` and `bertforge finetune` write, to show that a change of code left
behaviour unchanged: short fixed-seed runs (fp32, CPU, one thread), then the sha256 of every file they wrote.

Values that measure time are left out of the fingerprint: `written` of run_options.json and the modification
times in its input fingerprints, `seconds` of eval_results.json / manifest.json (and the manifest's
tokens_per_second), `elapsed_seconds` / `train_examples_per_s` of a fine-tune's results, the trainer state's
`elapsed_s` / `step_time` / `tokens_per_s` / its log window's `time`, and speed.jsonl. The list of what bertforge
wrote (.bertforge-written.json) counts by the files it names, since the sums it keeps of files that hold timings
differ run to run. Everything else, weights, configs, tokenizers, metrics and plots included, must match byte for
byte.

    python benchmarks/behaviour_snapshot.py --save /tmp/before.txt             # on the old code
    python benchmarks/behaviour_snapshot.py --compare /tmp/before.txt          # on the new code: differences, exit 1

Runs use --work (default /tmp/bertforge-snapshot, emptied first), so that paths recorded in the outputs agree.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

RECIPES = ("bert", "roberta", "albert", "spanbert", "electra", "structbert", "xlnet", "gpt", "modern", "t5", "bart")
CLASSIFY_FROM = ("bert", "roberta", "electra", "modern")   # sst2 fine-tunes of these pretrained models
SEQ2SEQ_FROM = ("t5", "bart")                               # seq2seq fine-tunes (sentence -> label word)
SST2 = Path(os.environ.get("BERTFORGE_DATA", next((p for p in (Path(__file__).resolve().parents[2] / "shared" / "data",
            Path("/work/shared/data")) if p.is_dir()), Path("../shared/data")))) / "glue" / "SST-2"
TIMING_KEYS = {"seconds", "tokens_per_second", "elapsed_s", "step_time", "tokens_per_s", "time", "elapsed_seconds",
               "train_examples_per_s"}
SKIPPED_FILES = {"speed.jsonl"}
MANIFEST = ".bertforge-written.json"  # what bertforge wrote in an output folder, with sizes and sums


def bertforge(*args: str) -> None:
    cmd = [sys.executable, "-c", "import sys; from bertforge.cli import main; sys.exit(main())", *args]
    print("$ bertforge", " ".join(args), flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}):\n{done.stdout[-3000:]}")


def without_timings(value, top_level_written: bool = False):
    """`value` with every timing key removed (and run_options.json's timestamp)."""
    if isinstance(value, dict):
        return {k: (without_mtimes(v) if k == "fingerprint" else without_timings(v)) for k, v in value.items()
                if k not in TIMING_KEYS and not (top_level_written and k == "written" and isinstance(v, str))}
    if isinstance(value, (list, tuple)):
        return [without_timings(v) for v in value]
    return value


def without_mtimes(value):
    """An input fingerprint without the files' modification times: [path, size, mtime_ns] -> [path, size]."""
    if isinstance(value, list) and len(value) == 3 and isinstance(value[0], str) and isinstance(value[2], int):
        return value[:2]
    if isinstance(value, list):
        return [without_mtimes(v) for v in value]
    if isinstance(value, dict):
        return {k: without_mtimes(v) for k, v in value.items()}
    return value


def canonical_torch(value, out: "hashlib._Hash") -> None:
    import torch
    if isinstance(value, dict):
        for k in value:
            if k in TIMING_KEYS:
                continue
            out.update(repr(k).encode())
            canonical_torch(value[k], out)
    elif isinstance(value, (list, tuple)):
        out.update(f"[{len(value)}".encode())
        for v in value:
            canonical_torch(v, out)
    elif torch.is_tensor(value):
        out.update(f"{value.dtype}{tuple(value.shape)}".encode())
        out.update(value.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    else:
        out.update(repr(value).encode())


def fingerprint(path: Path) -> str:
    h = hashlib.sha256()
    if path.name == MANIFEST:  # the sums of files that hold timings differ run to run: compare what was written
        manifest = json.loads(path.read_text())
        h.update(json.dumps({**manifest, "files": sorted(manifest.get("files", {}))}, sort_keys=True).encode())
    elif path.suffix == ".json":
        h.update(json.dumps(without_timings(json.loads(path.read_text()), path.name == "run_options.json"),
                            sort_keys=True).encode())
    elif path.suffix == ".jsonl":
        for line in path.read_text().splitlines():
            h.update(json.dumps(without_timings(json.loads(line)), sort_keys=True).encode() + b"\n")
    elif path.suffix == ".pt":
        import torch
        canonical_torch(torch.load(path, map_location="cpu", weights_only=True), h)
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def sst2_slices(work: Path) -> tuple[Path, Path, Path, Path]:
    """200 training rows and 100 dev rows of SST-2 (TSV), and the same as source -> target jsonl."""
    out = []
    for split, rows in (("train", 200), ("dev", 100)):
        with open(SST2 / f"{split}.tsv", newline="") as f:
            table = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        head, body = table[0], table[1:rows + 1]
        tsv = work / f"sst2-{split}.tsv"
        tsv.write_text("".join("\t".join(r) + "\n" for r in [head, *body]))
        jsonl = work / f"sst2-{split}.jsonl"
        jsonl.write_text("".join(json.dumps({"source": r[0], "target": ("negative", "positive")[int(r[1])]}) + "\n"
                                 for r in body))
        out += [tsv, jsonl]
    return out[0], out[2], out[1], out[3]


def run_all(work: Path, recipes: tuple[str, ...]) -> None:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    common = ["--seed", "0", "--precision", "fp32", "--device", "cpu", "--no-progress"]
    for recipe in recipes:
        bertforge("pretrain", "--recipe", recipe, "--size", "bert-tiny", "--max-steps", "12", "--threads", "1",
                  "--out", str(work / "pretrain" / recipe), *common)
    train_tsv, dev_tsv, train_jsonl, dev_jsonl = sst2_slices(work)
    for recipe in (r for r in CLASSIFY_FROM if r in recipes):
        bertforge("finetune", "--task", "sst2", "--model", str(work / "pretrain" / recipe), "--train", str(train_tsv),
                  "--eval", str(dev_tsv), "--max-steps", "12", "--batch-size", "16", "--max-seq-len", "64",
                  "--out", str(work / "finetune" / recipe), *common)
    for recipe in (r for r in SEQ2SEQ_FROM if r in recipes):
        bertforge("finetune", "--task", "seq2seq", "--model", str(work / "pretrain" / recipe),
                  "--train", str(train_jsonl), "--eval", str(dev_jsonl), "--max-steps", "6", "--batch-size", "16",
                  "--max-seq-len", "64", "--max-target-len", "4", "--limit", "20",
                  "--out", str(work / "finetune-seq2seq" / recipe), *common)


def fingerprints(work: Path) -> dict[str, str]:
    return {str(p.relative_to(work)): fingerprint(p) for p in sorted(work.rglob("*"))
            if p.is_file() and p.name not in SKIPPED_FILES and not p.name.endswith(".lock")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/bertforge-snapshot"))
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES)
    ap.add_argument("--save", type=Path, help="write 'sha256  file' lines here")
    ap.add_argument("--compare", type=Path, help="compare with a file written by --save; exit 1 on a difference")
    ap.add_argument("--hash-only", action="store_true", help="fingerprint --work as it is, without running")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if not args.hash_only:
        run_all(args.work, tuple(args.recipes))
    found = fingerprints(args.work)
    lines = [f"{digest}  {name}" for name, digest in found.items()]
    print("\n".join(lines))
    if args.save:
        args.save.write_text("\n".join(lines) + "\n")
    if args.compare:
        before = dict(reversed(line.split("  ", 1)) for line in args.compare.read_text().splitlines() if line)
        differ = sorted(k for k in before.keys() | found.keys() if before.get(k) != found.get(k))
        for name in differ:
            print(f"DIFFERS: {name} ({'missing' if name not in found else 'new' if name not in before else 'changed'})")
        print(f"{len(found)} files, {len(differ)} differ")
        return 1 if differ else 0
    print(f"{len(found)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
