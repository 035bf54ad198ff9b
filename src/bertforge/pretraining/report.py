"""What a pretraining run prints: the setup line, the stuck-at-baseline and diverged warnings, and the summary."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.pretraining.options import PretrainOptions

CURVES = "curves.png"


def setup_line(opts: PretrainOptions, model_type: str, n_params: int, world: int, lr: float, warmup: float, threads: int,
               n_examples: int, size: str | None = None) -> str:
    """The one line that says what is about to train; `size` is the model's (with --init-from, the checkpoint's
    shape, not the --size default)."""
    r = opts.recipe
    masks = "dynamic" if r.dynamic else f"static x{r.dupe_factor}"
    masking = ("next token, nothing masked" if r.objective == "clm"
               else f"masking {r.masking} {r.mask_prob:.0%} ({masks})")
    return (f"pretraining {r.name}: objective {r.objective}, {masking}, input {r.input_format}, "
            f"{size or opts.size} ({model_type}, {n_params / 1e6:.1f}M parameters), seq {opts.seq_len}, "
            f"batch {opts.batch_size}x{world}, lr {lr:g} (warm-up {warmup:.0%}, {r.schedule} schedule), "
            f"{opts.precision}, "
            f"{threads} thread(s), {n_examples:,} training examples")


def stuck_warning(metrics: dict[str, float], step: int, lr: float, default_lr: float, size: str) -> str:
    """One line for a run whose held-out MLM accuracy sits at the most-frequent-token baseline, with the likely
    cause: a learning rate above the size's default, else too few steps (or a rate still too high)."""
    head = (f"warning: after {step} steps held-out MLM accuracy {metrics['mlm_acc']:.3f} is no better than always "
            f"predicting the most frequent token ({metrics['baseline_acc']:.3f}). ")
    if lr > default_lr * 1.01:
        return head + (f"Likely cause: lr {lr:g} is too high for {size} (its default is {default_lr:g}); "
                       f"rerun with a lower --lr.")
    return head + (f"Likely cause: too few steps for {size} (give more --max-steps or --time-budget), or lr "
                   f"{lr:g} still too high for this data (try a lower --lr).")


def curves_line(out: Path, since: float) -> str:
    """The truth about OUT/curves.png: written by this run (modified at or after `since`, a time.time()), or not."""
    path = out / CURVES
    if path.is_file() and path.stat().st_mtime >= since - 1:
        return f"training curves: {path}"
    return f"{CURVES} not written: pip install 'bertforge[plot]' (matplotlib) to get training curves"


def print_summary(result: dict[str, Any], out: Path, curves: str) -> None:
    m = result["heldout"]
    print(f"\nheld-out after {result['steps']} steps ({result['seconds']['train']:.0f} s training, "
          f"{result['seconds']['total']:.0f} s total):")
    if "mlm_acc" in m:
        print(f"  MLM accuracy {m['mlm_acc']:.3f}   (most-frequent-token baseline {m['baseline_acc']:.3f})   "
              f"loss {m.get('mlm_loss', float('nan')):.3f}   perplexity {m.get('mlm_ppl', float('nan')):.1f}")
    if "lm_ppl" in m and "bigram_ppl" not in m:  # an encoder-decoder's targets (pretraining.seq2seq)
        print(f"  target perplexity {m['lm_ppl']:.1f}   (unigram {m['unigram_ppl']:.1f})   loss {m['lm_loss']:.3f}   "
              f"accuracy {m['lm_acc']:.3f}   (unigram {m['unigram_acc']:.3f})")
    elif "lm_ppl" in m:
        print(f"  next-token perplexity {m['lm_ppl']:.1f}   (bigram {m['bigram_ppl']:.1f}, unigram "
              f"{m['unigram_ppl']:.1f})   loss {m['lm_loss']:.3f}   accuracy {m['lm_acc']:.3f}")
    for key, label in (("nsp_acc", "NSP accuracy"), ("sop_acc", "SOP accuracy"), ("sbo_acc", "SBO accuracy"),
                       ("rtd_acc", "RTD accuracy")):
        if key in m:
            print(f"  {label} {m[key]:.3f}")
    for name, s in result.get("heldout_sets", {}).items():
        print(f"  --heldout {name}: MLM accuracy {s['mlm_acc']:.3f}   (baseline {s['baseline_acc']:.3f})   "
              f"loss {s['mlm_loss']:.3f}   ({s['masked_tokens']:.0f} masked tokens)")
    for f in result["fill_mask"]:
        preds = ", ".join(f"{p['token']} ({p['score']:.2f})" for p in f["predictions"])
        print(f"  fill-mask: {f['text'][:90]!r}\n     answer {f['answer']!r} -> {preds}")
    for d in result.get("denoising", []):
        print(f"  denoise: {d['input'][:90]!r}\n     target {d['target'][:90]!r}\n     output {d['output'][:90]!r}")
    for sample in result.get("samples", []):
        print(f"  sample: {sample['prompt']!r} -> {sample['continuation'][:160]!r}")
    note = expectation(result)
    if note:
        print(note)
    print(f"saved the model and tokenizer to {out} (eval_results.json, metrics.jsonl)")
    print(curves)


def expectation(result: dict[str, Any]) -> str | None:
    """What a user should make of fill-mask examples that mostly miss their answer or all get the same first guess
    (the demo's "the . , a" after its few CPU minutes), and how to get a model whose guesses fit the context; None
    for a model whose guesses look like it has learned from the context."""
    fills = [f for f in result.get("fill_mask", []) if f["predictions"]]
    hits = sum(f["answer"] in [p["token"] for p in f["predictions"]] for f in fills)
    firsts = {f["predictions"][0]["token"] for f in fills}
    same = len(firsts) == 1 and len(fills) > 1  # one guess for every context: frequency, not meaning
    if not fills or (hits * 2 > len(fills) and not same):
        return None
    said = [f"every mask above gets {firsts.pop()!r} first"] if same else []
    if hits < len(fills):
        said.append(f"the answer is not among the guesses for {len(fills) - hits} of {len(fills)}")
    return (f"what to expect: {', and '.join(said)}. After "
            f"{result['steps']} steps the model knows at best which tokens are frequent, not yet which fit the "
            "context: a few CPU minutes show the whole pipeline, not a usable model (even 40 minutes of bert-mini on "
            "two cores still answers with function words). For masks filled with fitting words: train far longer "
            "with a larger model (--size bert-mini --time-budget 8h, on a GPU with --device cuda), or continue a "
            "pretrained checkpoint on your text (--init-from DIR --corpus FILE)")
