"""`exatrain report RUN_DIR...`: a scaling study as one self-contained HTML file and the same tables in
Markdown.

Reads each run's summary.json (ranks, tokens/s), metrics.jsonl (loss curve, step-time breakdown) and
monitor/*.jsonl (GPU utilisation, when monitored). Plots are drawn with matplotlib and embedded as PNG
(base64), so the page needs no network and no JavaScript. Speedup and efficiency are against the run with
the fewest ranks: speedup = tokens/s / tokens/s of that run; efficiency = speedup / (ranks / its ranks).
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from exatrain.errors import ExatrainError
from exatrain.observe.gpu_monitor import read_samples
from exatrain.observe.metrics import read_metrics

PHASES = ("data", "forward_backward", "optimizer", "checkpoint")


def expand_run_dirs(paths: list[str]) -> list[Path]:
    """Run directories (with summary.json) given directly or as a study folder holding them."""
    runs = []
    for p in map(Path, paths):
        if (p / "summary.json").exists():
            runs.append(p)
        else:
            found = sorted(d for d in p.iterdir() if (d / "summary.json").exists()) if p.is_dir() else []
            if not found:
                raise ExatrainError(
                    f"{p}: no summary.json in it or in its sub-folders (not a finished run)",
                    "pass run directories of finished `exatrain train` runs, or the folder of "
                    "`exatrain scale`",
                )
            runs += found
    return runs


def load_run(run_dir: Path) -> dict:
    """What the report needs of one run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    train = [m for m in metrics if m.get("kind") == "train"]
    breakdown = {p: _mean([m.get(f"time_{p}_s") for m in train]) for p in PHASES}
    gpu_util = (
        [
            g["util_pct"]
            for f in sorted((run_dir / "monitor").glob("*.jsonl"))
            for s in read_samples(f)
            for g in s["gpus"]
            if g.get("util_pct") is not None
        ]
        if (run_dir / "monitor").is_dir()
        else []
    )
    return {
        "name": run_dir.name,
        "ranks": summary["world_size"],
        "tokens_per_s": summary["tokens_per_s"],
        "train_seconds": summary["train_seconds"],
        "steps": summary["steps"],
        "loss": [(m["step"], m["loss"]) for m in train if m.get("loss") is not None],
        "breakdown": breakdown,
        "gpu_util": _mean(gpu_util),
        "stragglers": [
            {**m["straggler_flagged"], "step": m["step"]} for m in train if m.get("straggler_flagged")
        ],
    }


def _mean(values):
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def scaling_rows(runs: list[dict]) -> list[dict]:
    """Runs sorted by ranks, with speedup and efficiency against the run with the fewest ranks."""
    runs = sorted(runs, key=lambda r: r["ranks"])
    base = runs[0]
    rows = []
    for r in runs:
        speedup = r["tokens_per_s"] / base["tokens_per_s"]
        rows.append({**r, "speedup": speedup, "efficiency": speedup / (r["ranks"] / base["ranks"])})
    return rows


def markdown(rows: list[dict]) -> str:
    """The scaling and breakdown tables in Markdown."""
    out = [
        "| run | ranks | tokens/s | speedup | efficiency | train s | GPU busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        util = f"{r['gpu_util']:.0f} %" if r["gpu_util"] is not None else "-"
        out.append(
            f"| {r['name']} | {r['ranks']} | {r['tokens_per_s']:,.0f} | {r['speedup']:.2f} | "
            f"{r['efficiency']:.0%} | {r['train_seconds']:.1f} | {util} |"
        )
    out += [
        "",
        "| run | ranks | " + " | ".join(f"{p} s/step" for p in PHASES) + " |",
        "|---|---|" + "---|" * len(PHASES),
    ]
    for r in rows:
        cells = " | ".join("-" if r["breakdown"][p] is None else f"{r['breakdown'][p]:.4f}" for p in PHASES)
        out.append(f"| {r['name']} | {r['ranks']} | {cells} |")
    flags = [(r["name"], f) for r in rows for f in r.get("stragglers", [])]
    if flags:
        out += ["", "Stragglers flagged:", "", "| " + " | ".join(STRAGGLER_HEAD) + " |", "|---" * 8 + "|"]
        out += ["| " + " | ".join(map(str, _straggler_cells(name, f))) + " |" for name, f in flags]
    return "\n".join(out) + "\n"


#: the columns of the stragglers table (a rank flagged by StepMetrics: slow for N log intervals in a row)
STRAGGLER_HEAD = ("run", "step", "rank", "host", "device", "phase", "slows steps by", "intervals")


def _straggler_cells(name: str, f: dict) -> tuple:
    return (
        name,
        f["step"],
        f["rank"],
        f["host"],
        f["device"],
        f["phase"],
        f"x{f['ratio']:.2f}",
        f["intervals"],
    )


def _html_stragglers(rows: list[dict]) -> str:
    """The stragglers table (empty when no run flagged one)."""
    flags = [(r["name"], f) for r in rows for f in r.get("stragglers", [])]
    if not flags:
        return ""
    head = "".join(f"<th>{h}</th>" for h in STRAGGLER_HEAD)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in _straggler_cells(name, f)) + "</tr>"
        for name, f in flags
    )
    return f"<h2>Stragglers flagged</h2><table><tr>{head}</tr>{body}</table>"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def check_plotting() -> None:
    """Raise ExatrainError (with a HINT) when matplotlib is missing: `exatrain scale` asks before its first
    run, so a study never trains for an hour and then fails at its report."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ExatrainError(
            "the report's plots need matplotlib, which is not installed in this environment",
            "pip install matplotlib (a dependency of exatrain: `pip install exatrain` installs it; "
            "so does `pip install 'exatrain[report]'`)",
        )


def figures(rows: list[dict]) -> list[tuple[str, str]]:
    """(title, base64 PNG) of each plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [r["ranks"] for r in rows]
    out = []
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ranks, [r["tokens_per_s"] for r in rows], "o-", label="measured")
    ax.plot(ranks, [rows[0]["tokens_per_s"] * n / ranks[0] for n in ranks], "--", label="ideal")
    ax.set(xlabel="ranks (GPUs)", ylabel="tokens/s", title="Throughput")
    ax.legend()
    out.append(("Throughput vs ranks", _png(fig)))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(ranks, [r["speedup"] for r in rows], "o-", label="measured")
    a1.plot(ranks, [n / ranks[0] for n in ranks], "--", label="ideal")
    a1.set(xlabel="ranks", ylabel="speedup", title="Speedup")
    a1.legend()
    a2.bar([str(n) for n in ranks], [r["efficiency"] * 100 for r in rows])
    a2.axhline(100, linestyle="--", color="gray")
    a2.set(xlabel="ranks", ylabel="% of ideal", title="Efficiency")
    out.append(("Speedup and efficiency", _png(fig)))
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["loss"]:
            ax.plot(*zip(*r["loss"]), label=f"{r['ranks']} rank(s)")
    ax.set(xlabel="step", ylabel="training loss", title="Loss")
    ax.legend()
    out.append(("Loss curves", _png(fig)))
    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = [0.0] * len(rows)
    for p in PHASES:
        vals = [r["breakdown"][p] or 0.0 for r in rows]
        ax.bar([str(n) for n in ranks], vals, bottom=bottom, label=p)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(xlabel="ranks", ylabel="seconds per step (mean over ranks)", title="Step-time breakdown")
    ax.legend()
    out.append(("Step-time breakdown", _png(fig)))
    if any(r["gpu_util"] is not None for r in rows):
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar([str(n) for n in ranks], [r["gpu_util"] or 0.0 for r in rows])
        ax.set(xlabel="ranks", ylabel="mean GPU utilisation %", title="GPU utilisation")
        out.append(("GPU utilisation", _png(fig)))
    plt.close("all")
    return out


def html_page(rows: list[dict], title: str = "exatrain scaling report") -> str:
    """One self-contained HTML page: the tables and the plots (embedded PNG)."""
    table = _html_table(rows) + _html_stragglers(rows)
    imgs = "\n".join(
        f'<figure><img alt="{html.escape(t)}" src="data:image/png;base64,{b64}">'
        f"<figcaption>{html.escape(t)}</figcaption></figure>"
        for t, b64 in figures(rows)
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #999;padding:4px 8px;text-align:right}figure{display:inline-block;margin:1em}"
        f"</style></head><body><h1>{html.escape(title)}</h1>{table}{imgs}</body></html>\n"
    )


def _html_table(rows: list[dict]) -> str:
    head = "".join(
        f"<th>{h}</th>" for h in ("run", "ranks", "tokens/s", "speedup", "efficiency", "train s", "GPU busy")
    )
    body = "".join(
        f"<tr><td>{html.escape(r['name'])}</td><td>{r['ranks']}</td><td>{r['tokens_per_s']:,.0f}</td>"
        f"<td>{r['speedup']:.2f}</td><td>{r['efficiency']:.0%}</td><td>{r['train_seconds']:.1f}</td>"
        f"<td>{'-' if r['gpu_util'] is None else format(r['gpu_util'], '.0f') + ' %'}</td></tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def write_report(paths: list[str], out: str | Path) -> tuple[Path, Path, list[dict]]:
    """Write OUT (HTML) and OUT with .md (Markdown); returns both paths and the rows."""
    rows = scaling_rows([load_run(p) for p in expand_run_dirs(paths)])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html_page(rows))
    md = out.with_suffix(".md")
    md.write_text(markdown(rows))
    return out, md, rows
