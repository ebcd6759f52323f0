"""The gain curve of the extension experiment (``benchmarks/bench_extension.py``): every saved checkpoint of
the fine-tune and of the control measured (kept in ``curve/``, one file per measurement), each point as the
report prints it, and the report's two figures (perplexity against length; the gain against training
tokens).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the drivers beside it, run from anywhere
from extension_plan import ROLES, RUN_DIRS, SUITE_OF  # noqa: E402


def curve(out: Path, plan, suites: set[str], tasks: tuple[str, ...] = ("perplexity",)) -> list[dict]:
    """Each saved checkpoint measured (kept in curve/): perplexity of the fine-tune at the target length and
    of the control at L; with ``passkey`` in ``tasks``, both models' passkey at the shortest passkey length
    on the plan's prompts (the suites' own: the same 30 prompts as the export's cell)."""
    import torch

    import ropescale as rs
    from ropescale.data.documents import load_documents, tokenize_documents
    from ropescale.evals.tasks.passkey import run_passkey
    from ropescale.models.runtime import resolve_runtime
    from ropescale.scoring.perplexity import evaluate_perplexity
    from ropescale.training.checkpoints import list_checkpoints
    from ropescale.training.data import split_holdout
    from ropescale.training.export import merged_model

    cells, points = out / "curve", []
    cells.mkdir(parents=True, exist_ok=True)
    tokenizer = rs.load_tokenizer(plan.model)
    _, held = split_holdout(load_documents(plan.data), ["Emma"])
    doc = tokenize_documents(tokenizer, held, max_tokens=max(plan.ppl_lengths))[0]
    runtime = resolve_runtime("auto", plan.dtype)  # the GPU where there is one
    short = min(plan.passkey_lengths)

    def passkey(model) -> dict:
        r = run_passkey(
            model, tokenizer, [short], plan.depths, plan.trials, seed=plan.seed, progress=False, jitter=plan.jitter
        )
        hits = [bool(rec["correct"]) for rec in r.to_dict()["records"]]
        return {"passkey": sum(hits) / len(hits), "passkey_trials": len(hits)}

    for role, length in ((FINE_TUNED, max(plan.ppl_lengths)), (CONTROL, plan.original_context)):
        if SUITE_OF[role][0] not in suites:
            continue
        run = out / RUN_DIRS[role]
        for ckpt in list_checkpoints(run):
            step = int(ckpt.name.split("-")[1])
            tokens = json.loads((ckpt / "state.json").read_text())["tokens"]
            todo = {  # one file per measurement: a task added later leaves the other's points as they are
                task: cells / f"{RUN_DIRS[role]}-{step}-{length if task == 'perplexity' else f'passkey-{short}'}.json"
                for task in tasks
            }
            todo = {task: path for task, path in todo.items() if not path.is_file()}
            if todo:
                model = runtime.place(merged_model(run, ckpt.name).to(runtime.torch_dtype)).eval()
                for task, path in todo.items():
                    with torch.inference_mode():
                        if task == "perplexity":
                            r = evaluate_perplexity(
                                model,
                                [doc],
                                window=length,
                                mode="nonoverlap",
                                bos_token_id=tokenizer.bos_token_id,
                                max_tokens=max(length, plan.ppl_max_tokens),
                            )
                            point = {"length": length, "ppl": r.ppl}
                        else:
                            point = {"length": short, **passkey(model), "jitter": plan.jitter}
                    path.write_text(json.dumps({"role": role, "step": step, "tokens": tokens, **point}))
                    print(f"curve {role} step {step} ({tokens} tokens): {curve_text(point)}")
                del model
            points += [json.loads(f.read_text()) for f in sorted(cells.glob(f"{RUN_DIRS[role]}-{step}-*.json"))]
    return points


def curve_text(p: dict) -> str:
    """One curve point as the report prints it."""
    if "ppl" in p:
        return f"PPL({p['length'] // 1024}k) {p['ppl']:.3f}"
    return f"passkey {p['length'] // 1024}k {round(p['passkey'] * p['passkey_trials'])}/{p['passkey_trials']}"


def plot(out: Path, rows, points, plan) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    files = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {role: f"C{i}" for i, role in enumerate(ROLES)}  # one color per model, whichever are measured
    for r in (r for r in rows if r.ppl):  # a model measured on retrieval only has no curve (nor legend entry)
        xs = sorted(r.ppl)
        ax.plot(xs, [r.ppl[x] for x in xs], marker="o", label=r.label, color=colors.get(r.label))
    ax.axvline(plan.original_context, color="grey", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # 27.5, not 2.75 x 10^1
        axis(FormatStrFormatter("%g"))
    ax.set_xticks(list(plan.ppl_lengths), [f"{n // 1024}k" for n in plan.ppl_lengths])
    ax.set_xlabel("window length (tokens); dotted: trained context")
    ax.set_ylabel("perplexity on held-out Emma (log)")
    ax.set_title(f"{plan.model}: YaRN ×{plan.factor:g}, fine-tuned vs control")
    ax.legend()
    fig.tight_layout()
    files.append(str(out / "perplexity.png"))
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)
    kinds = [k for k in ("ppl", "passkey") if any(k in p for p in points)]
    if kinds:
        fig, axes = plt.subplots(1, len(kinds), figsize=(6.4 * len(kinds), 4.2), squeeze=False)
        by = {r.label: r for r in rows}
        start = {FINE_TUNED: by.get("yarn"), CONTROL: by.get("none")}  # before training: step 0
        for ax, kind in zip(axes[0], kinds):
            for role in (FINE_TUNED, CONTROL):
                pts = sorted((p["tokens"], p[kind], p["length"]) for p in points if p["role"] == role and kind in p)
                first = start[role]
                before = (first.ppl if kind == "ppl" else first.passkey) if first is not None else {}
                if pts and pts[0][2] in before:
                    pts.insert(0, (0, before[pts[0][2]], pts[0][2]))
                if pts:
                    name = "PPL" if kind == "ppl" else "passkey"
                    ax.plot(
                        [t for t, _, _ in pts],
                        [v for _, v, _ in pts],
                        marker="o",
                        label=f"{role}: {name}({pts[0][2] // 1024}k)",
                    )
            ax.set_xlabel("training tokens (0: training-free yarn / the unscaled model)")
            ax.set_ylabel("held-out perplexity" if kind == "ppl" else "passkey accuracy (30 prompts)")
            ax.set_title("perplexity against training tokens" if kind == "ppl" else "retrieval against training tokens")
            ax.legend()
        fig.tight_layout()
        files.append(str(out / "curve.png"))
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)
    return files
