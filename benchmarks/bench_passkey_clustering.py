"""Are a passkey cell's 30 prompts 30 measurements? Agreement within depth groups, fixed placement
against jittered, read from finished suite cells.

With the papers' placement (``evals/tasks/passkey.py``) the 6 trials of one (length, depth) sit at the
same token offset and differ only in the key's digits; with ``jitter`` each draws its own depth from
a band around it. For every passkey cell of the given result folders this prints the accuracy, the
number of depth groups whose trials all agree, the intra-class correlation of the answers, the
design effect and effective number of trials it implies, and the plain and the design-corrected
Wilson intervals (:func:`ropescale.evals.tasks.proportions.group_agreement`), then the cells measured with
both placements side by side.

    python benchmarks/bench_passkey_clustering.py runs/passkey-jitter runs/smollm2-frontier-32k-30

Reads cells only (no model); ``--json FILE`` also writes the rows (atomically); ``--plot FILE``
draws every trial where its needle sat (one line per cell; o found, x lost), fixed and jittered
cells of one model and length next to each other.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="suite result folders (each with cells/)")
    p.add_argument("--lengths", default=None, help="only these prompt lengths, e.g. 4096,8192")
    p.add_argument("--labels", default=None, help="only these cell labels (file-name form), e.g. none,yarn")
    p.add_argument(
        "--rename",
        action="append",
        default=[],
        metavar="FOLDER=NAME",
        help="call the cells of FOLDER NAME (repeatable; two fine-tunes both labelled 'fine-tuned yarn')",
    )
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument("--plot", default=None, help="also draw each trial at its needle's position here (PNG)")
    return p.parse_args(argv)


def cell_rows(folder: Path) -> list[dict]:
    """One row per finished passkey cell of a suite result folder."""
    from ropescale.evals.tasks.proportions import depth_groups, group_agreement

    rows = []
    for path in sorted((folder / "cells").glob("*__passkey__*.json")):
        cell = json.loads(path.read_text())
        result = cell["result"]
        groups = depth_groups(result["records"])
        if len(groups) < 2 or len({len(g) for g in groups}) != 1:
            print(f"{path}: skipped (depth groups of unequal size)", file=sys.stderr)
            continue
        protocol = (cell.get("measured") or {}).get("protocol") or {}
        stats = group_agreement(groups)
        rows.append(
            {
                "trials": [(r["needle_start"] / int(cell["length"]), bool(r["correct"])) for r in result["records"]],
                "prompts": {
                    (r["depth"], r["trial"], r["key"], r["needle_start"]): bool(r["correct"]) for r in result["records"]
                },
                "folder": str(folder),
                "label": path.name.split("__")[0],
                "length": int(cell["length"]),
                "jitter": float(protocol.get("jitter", 0.0)),
                "device": (cell.get("runtime") or {}).get("device", "?"),
                **stats,
            }
        )
    return rows


def _interval(pair) -> str:
    return f"[{pair[0]:.2f}, {pair[1]:.2f}]"


def print_rows(rows: list[dict]) -> None:
    from ropescale.markdown import table

    cells = []
    for r in sorted(rows, key=lambda r: (r["label"], r["length"], r["jitter"], r["folder"])):
        placement = f"jitter {r['jitter']:g}" if r["jitter"] else "fixed"
        icc = "-" if r["icc"] is None else f"{r['icc']:.2f}"
        correct = f"{round(r['accuracy'] * r['n'])}/{r['n']}"
        cells.append(
            [f"{r['folder']} ({r['device']})", r["label"], r["length"], placement, correct]
            + [f"{r['unanimous']}/{r['groups']}", icc, f"{r['design_effect']:.1f}", f"{r['effective_n']:.1f}"]
            + [_interval(r["interval"]), _interval(r["effective_interval"])]
        )
    heads = ["run", "model", "length", "placement", "correct", "groups unanimous", "ICC", "design effect"]
    heads += ["effective n", "95% Wilson (n)", "95% Wilson (effective n)"]
    print(table(heads, cells, align="llrlrrrrrll"))
    fixed = [r for r in rows if not r["jitter"]]
    jittered = [r for r in rows if r["jitter"]]
    pooled = {
        name: (sum(r["unanimous"] for r in part), sum(r["groups"] for r in part))
        for name, part in (("fixed", fixed), ("jittered", jittered))
        if part
    }
    for name, (same, total) in pooled.items():
        print(f"{name}: {same}/{total} depth groups answered alike throughout ({same / total:.0%})")
    print_pairs(rows)


def folder_names(folders) -> dict[str, str]:
    """Each folder by the fewest trailing path parts that tell it from the others (``a/finetuned`` and
    ``b/finetuned``, not ``finetuned`` twice)."""
    parts = {f: Path(f).parts for f in set(folders)}
    names = {}
    for f, own in parts.items():
        k = 1
        while k < len(own) and any(o[-k:] == own[-k:] for g, o in parts.items() if g != f):
            k += 1
        names[f] = "/".join(own[-k:])
    return names


def _name(row: dict, names: dict[str, str]) -> str:
    return f"{row['label']} ({names[row['folder']]})"


def print_pairs(rows: list[dict]) -> None:
    """Every two models measured on the same prompts (same keys and needle positions), compared prompt
    by prompt: the prompts only one of them gets right, and the exact McNemar p-value."""
    from ropescale.evals.tasks.proportions import paired_split
    from ropescale.markdown import table

    lines, names = [], folder_names(r["folder"] for r in rows)
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            if a["length"] != b["length"] or a["prompts"].keys() != b["prompts"].keys():
                continue
            keys = list(a["prompts"])
            only_a, only_b, p = paired_split([a["prompts"][k] for k in keys], [b["prompts"][k] for k in keys])
            placement = f"jitter {a['jitter']:g}" if a["jitter"] else "fixed"
            pair = f"{_name(a, names)} vs {_name(b, names)}"
            lines.append([pair, a["length"], placement, only_a, only_b, f"{p:.3g}"])
    if lines:
        print("\nSame prompts, prompt by prompt (right for one model only; exact McNemar p):\n")
        print(table(["models (a vs b)", "length", "placement", "only a", "only b", "p"], lines, align="lrlrrr"))


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = []
    for folder in map(Path, args.results):
        if not (folder / "cells").is_dir():
            print(f"{folder}: no cells/ folder (a suite's --output)", file=sys.stderr)
            return 2
        rows += cell_rows(folder)
    names = dict(item.split("=", 1) for item in args.rename)
    for r in rows:
        r["label"] = names.get(r["folder"], r["label"])
    if args.lengths:
        rows = [r for r in rows if r["length"] in {int(x) for x in args.lengths.split(",")}]
    if args.labels:
        rows = [r for r in rows if r["label"] in set(args.labels.split(","))]
    if not rows:
        print("no finished passkey cells in " + ", ".join(args.results), file=sys.stderr)
        return 2
    print_rows(rows)
    if args.json:
        from ropescale._io import atomic_write_json

        atomic_write_json(args.json, [{k: v for k, v in r.items() if k not in ("trials", "prompts")} for r in rows])
    if args.plot:
        order = args.labels.split(",") if args.labels else None
        print(f"plot: {plot_trials(rows, args.plot, order)}")
    return 0


def plot_trials(rows: list[dict], path: str, order: list[str] | None = None) -> Path:
    """Each cell a line, each trial a mark at its needle's position in the prompt (o found, x lost);
    models in ``order`` (default: by name), then by length and placement."""
    from ropescale.plots import figure, length_label, save_png

    rank = {label: i for i, label in enumerate(order or [])}
    rows = sorted(
        rows, key=lambda r: (rank.get(r["label"], len(rank)), r["label"], r["length"], r["jitter"], r["folder"])
    )
    fig = figure(figsize=(8, 0.45 * len(rows) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    for y, r in enumerate(rows):
        found = [x for x, ok in r["trials"] if ok]
        lost = [x for x, ok in r["trials"] if not ok]
        ax.scatter(found, [y] * len(found), marker="o", s=22, facecolors="none", edgecolors="tab:green")
        ax.scatter(lost, [y] * len(lost), marker="x", s=28, color="tab:red")
    labels = [
        f"{r['label']} {length_label(r['length'])} {'jittered' if r['jitter'] else 'fixed'} "
        f"{round(r['accuracy'] * r['n'])}/{r['n']}" + ("" if r["device"] == "cpu" else f" ({r['device']})")
        for r in rows
    ]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("needle position / prompt length   (o found, x lost)")
    ax.set_title("Passkey trials by where the needle sat (fixed depths: 6 keys on one spot)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
