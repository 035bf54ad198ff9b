"""A table's report: per arm and task the mean and spread over seeds, a verdict per claim, the paper's numbers
beside ours. Written as OUT/TABLE.json, OUT/TABLE.md and OUT/TABLE.png.

The verdict rule, stated so it can be checked by hand. For each seed that has every task of the claim for both
arms, an arm's score is its mean over those tasks (x100). With a >= 2 seeds each side:
  - "a > b": reproduced when every seed of a beats every seed of b (the seed ranges do not overlap, a above);
    not reproduced when they do not overlap with b above; otherwise inconclusive at this scale: the difference
    is inside the seed spread, and no winner is named by noise.
  - "a within t points of b": reproduced when every pair of seeds is within t; not reproduced when no pair is;
    otherwise inconclusive.
One seed measures no spread: its verdicts are all inconclusive. With 3+ seeds Welch's t-test p-value is reported
as well (scipy), for information; the rule above decides. Every table's first claim is the control: its baseline
arm against the same encoder fine-tuned from random initialisation. Until that claim is reproduced, every other
claim of the table is inconclusive too (what its seeds said is kept): the budget has not yet made pretraining
matter, so the arms' differences cannot be the papers' effects.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bertforge.io.write import atomic_write, atomic_write_text
from bertforge.lab.tables import CONTROL, RETRIEVAL, Claim, Table, tasks_of
from bertforge.pretraining.ablation import OWN_TASKS, table_cell

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, PENDING = "reproduced", "not reproduced", "inconclusive", "pending"


def seed_scores(records: dict[tuple[str, int], dict], arm: str, tasks: list[str]) -> dict[int, float]:
    """seed -> the arm's mean score (x100) over `tasks`, for seeds that have all of them."""
    out: dict[int, float] = {}
    if not tasks:
        return out
    for (a, seed), r in records.items():
        if a == arm and all(t in r.get("tasks", {}) for t in tasks):
            out[seed] = 100.0 * statistics.fmean(r["tasks"][t]["score"] for t in tasks)
    return out


def verdict(claim: Claim, a: list[float], b: list[float]) -> dict[str, Any]:
    """The claim's verdict from per-seed scores of its two arms (see the module docstring)."""
    if not a or not b:
        return {"verdict": PENDING}
    result: dict[str, Any] = {"a_mean": statistics.fmean(a), "b_mean": statistics.fmean(b), "n_a": len(a),
                              "n_b": len(b), "diff": statistics.fmean(a) - statistics.fmean(b),
                              "a_std": _std(a), "b_std": _std(b)}
    if len(a) < 2 or len(b) < 2:
        result["verdict"] = INCONCLUSIVE
        result["why"] = "one seed: no spread measured"
        return result
    if claim.tolerance is None:
        if min(a) > max(b):
            result["verdict"] = REPRODUCED
        elif max(a) < min(b):
            result["verdict"] = NOT_REPRODUCED
        else:
            result["verdict"], result["why"] = INCONCLUSIVE, "difference inside the seed spread"
    else:
        gaps = [abs(x - y) for x in a for y in b]
        if max(gaps) <= claim.tolerance:
            result["verdict"] = REPRODUCED
        elif min(gaps) > claim.tolerance:
            result["verdict"] = NOT_REPRODUCED
        else:
            result["verdict"], result["why"] = INCONCLUSIVE, "some seeds within the tolerance, some not"
    if len(a) >= 3 and len(b) >= 3:
        from scipy.stats import ttest_ind
        result["welch_p"] = float(ttest_ind(a, b, equal_var=False).pvalue)
    return result


def gate_on_control(claims: list[dict[str, Any]]) -> None:
    """Until the table's baseline arm beats the untrained control, no other claim is decided: arms that all fall
    short of no pretraining differ in how little harm they do, which is not what the paper measured. What the seeds
    alone said is kept as `seeds_say`."""
    control = next((c for c in claims if c["b"] == CONTROL), None)
    if control is None or control["verdict"] in (REPRODUCED, PENDING):
        return
    for c in claims:
        if c is not control and c["verdict"] in (REPRODUCED, NOT_REPRODUCED):
            c["seeds_say"], c["verdict"] = c["verdict"], INCONCLUSIVE
            c["why"] = (f"the seeds say {c['seeds_say']}, but {control['a']} does not beat the untrained control: "
                        "pretraining does not transfer yet at this budget")


def _std(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def table_report(table: Table, tasks: list[str], records: dict[tuple[str, int], dict],
                 setup: dict[str, Any]) -> dict[str, Any]:
    arms = {}
    for arm, label in table.arms.items():
        runs = [r for (a, _), r in sorted(records.items()) if a == arm and "pretrain" in r]
        per_task = {}
        for t in tasks:
            xs = [100.0 * r["tasks"][t]["score"] for r in runs if t in r["tasks"]]
            if xs:
                per_task[t] = {"mean": statistics.fmean(xs), "std": _std(xs), "n": len(xs), "scores": xs,
                               "metric": next(r["tasks"][t]["metric"] for r in runs if t in r["tasks"])}
        pre = [r["pretrain"] for r in runs]
        mean = lambda key: statistics.fmean(p[key] for p in pre) if pre and all(p.get(key) is not None  # noqa: E731
                                                                                 for p in pre) else None
        arms[arm] = {"label": label, "seeds": len(runs), "tasks": per_task, "steps": mean("steps"),
                     "tokens_seen": mean("tokens_seen"), "flops": mean("flops"),
                     "heldout_mlm_acc": mean("heldout_mlm_acc"), "train_seconds": mean("train_seconds"),
                     "own": {k: statistics.fmean(p[k] for p in pre) for k in _own_keys(pre)},
                     "cross": {k: statistics.fmean(p["common"][k] for p in pre)
                               for k in ("cross_nsp_acc", "cross_sop_acc")
                               if pre and all(k in p.get("common", {}) for p in pre)},
                     "average": _average(records, arm, tasks)}
    claims = []
    for c in table.claims:
        claim_tasks = list(c.tasks) if c.tasks else tasks
        claim_tasks = [t for t in claim_tasks if t in tasks]
        a, b = seed_scores(records, c.a, claim_tasks), seed_scores(records, c.b, claim_tasks)
        claims.append({"claim": c.text, "a": c.a, "b": c.b, "tasks": claim_tasks, "tolerance": c.tolerance,
                       "paper": c.paper, **verdict(c, list(a.values()), list(b.values()))})
    gate_on_control(claims)
    return {"table": table.name, "source": table.source, "setup": setup, "tasks": tasks, "arms": arms,
            "claims": claims, "paper": table.paper}


def _own_keys(pre: list[dict]) -> list[str]:
    return [k for k in OWN_TASKS if pre and all(k in p for p in pre)]


def _average(records, arm: str, tasks: list[str]) -> dict[str, float] | None:
    xs = list(seed_scores(records, arm, tasks).values())
    return {"mean": statistics.fmean(xs), "std": _std(xs), "n": len(xs)} if xs else None


def write_reports(out: Path, tables: list[Table], opts, records: dict[tuple[str, int], dict]) -> dict[str, Any]:
    reports = {}
    for table in tables:
        rep = table_report(table, tasks_of(table, opts.tasks), records, opts.setup())
        atomic_write_text(out / f"{table.name}.json", json.dumps(rep, indent=2) + "\n")
        if table.kind == RETRIEVAL:
            from bertforge.lab.realm_table import markdown as retrieval_markdown
            atomic_write_text(out / f"{table.name}.md", retrieval_markdown(rep))
        else:
            atomic_write_text(out / f"{table.name}.md", markdown(rep))
        figure(rep, out / f"{table.name}.png")
        reports[table.name] = rep
    return reports


def _cell(stat: dict | None) -> str:
    if not stat:
        return "-"
    return f"{stat['mean']:.1f} ± {stat['std']:.1f}" if stat.get("n", 1) > 1 else f"{stat['mean']:.1f}"


def markdown(rep: dict[str, Any]) -> str:
    s, tasks = rep["setup"], rep["tasks"]
    lines = [f"### {rep['table']}: {rep['source']}", "",
             f"Each arm pretrained for {s['budget'] + ' of wall clock' if s['budget'] else str(s['steps']) + ' steps'} "
             f"({s['size']}, seq {s['seq_len']}, batch "
             f"{s['batch_size']}, {s['precision']}) unless it says FLOPs-matched, then fine-tuned on every task with "
             f"one recipe (lr {s['finetune_lr']:g}, {s['finetune_epochs']:g} epochs, batch 32, best dev epoch); dev "
             f"scores x100, mean ± standard deviation over seeds.", "",
             "| arm | paper's label | seeds | steps | FLOPs | held-out MLM | own task | " + " | ".join(tasks)
             + " | average |", "|---|---|---:|---:|---:|---:|---|" + "---:|" * (len(tasks) + 1)]
    for arm, a in rep["arms"].items():
        own = ", ".join(f"{k.replace('_acc', '').upper()} {v:.3f}" for k, v in a["own"].items())
        cross = ", ".join(f"on {k.split('_')[1].upper()} {v:.3f}" for k, v in a["cross"].items())
        lines.append(f"| {arm} | {a['label']} | {a['seeds']} | {table_cell(a['steps'], '.0f')} | "
                     f"{table_cell(a['flops'], '.2e')} | {table_cell(a['heldout_mlm_acc'], '.3f')} | "
                     f"{'; '.join(x for x in (own, cross) if x) or '-'} | "
                     + " | ".join(_cell(a["tasks"].get(t)) for t in tasks) + f" | {_cell(a['average'])} |")
    lines += ["", "| claim | tasks | ours (a vs b) | verdict | paper |", "|---|---|---|---|---|"]
    for c in rep["claims"]:
        ours = "-" if c["verdict"] == PENDING else (
            f"{c['a']} {c['a_mean']:.1f} ± {c['a_std']:.1f} vs {c['b']} {c['b_mean']:.1f} ± {c['b_std']:.1f}"
            + (f" (Welch p {c['welch_p']:.2f})" if "welch_p" in c else ""))
        why = f" ({c['why']})" if c.get("why") else ""
        lines.append(f"| {c['claim']} | {', '.join(c['tasks'])} | {ours} | **{c['verdict']}**{why} | {c['paper']} |")
    if rep["paper"]:
        cols = list(dict.fromkeys(k for v in rep["paper"].values() for k in v))
        lines += ["", f"The paper's numbers ({rep['source']}), for direction:", "",
                  "| arm | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for arm, scores in rep["paper"].items():
            lines.append(f"| {arm} | " + " | ".join(table_cell(scores.get(k), '.1f') for k in cols) + " |")
    return "\n".join(lines) + "\n"


def figure(rep: dict[str, Any], path: Path) -> None:
    """Grouped bars: one group per task, one bar per arm, the seed standard deviation as error bars."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    tasks, arms = rep["tasks"] + ["average"], list(rep["arms"])
    width = 0.8 / max(len(arms), 1)
    fig, ax = plt.subplots(figsize=(1.3 * len(tasks) + 2, 3.6))
    for k, arm in enumerate(arms):
        a = rep["arms"][arm]
        stats = [a["tasks"].get(t) for t in rep["tasks"]] + [a["average"]]
        xs = [i + (k - (len(arms) - 1) / 2) * width for i in range(len(tasks))]
        ax.bar(xs, [st["mean"] if st else 0 for st in stats], width, yerr=[st["std"] if st else 0 for st in stats],
               label=arm, capsize=2)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("dev score x100")
    ax.set_title(f"{rep['table']}: {rep['setup']['budget'] or str(rep['setup']['steps']) + ' steps'} per arm, "
                 f"{rep['setup']['size']}")
    ax.legend(fontsize=7, ncol=min(len(arms), 3))
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
