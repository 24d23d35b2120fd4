"""Generated pages of the documentation site: the CLI reference (from the argument parser) and the
troubleshooting page (every HINT exatrain can print, found in the source, grouped by symptom).

scripts/update_docs.py writes them into docs/; tests/unit/test_docs_generated.py fails while a page differs
from what these functions return, so the pages always describe the code.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
WIDTH = 100  # help text width of the CLI reference, independent of the terminal that generates it

#: package (or package/module) -> the symptom under which its hints are listed, in page order
SYMPTOMS = {
    "config": "The configuration is refused",
    "env": "Ranks cannot tell where they run (launcher, SLURM, MPI variables, GPUs, CPU masks)",
    "launch": "`exatrain run` or local workers do not start",
    "slurm": "A SLURM job is refused before it is submitted",
    "distributed": "Ranks do not join, or a layout does not fit",
    "data": "Data is missing or unreadable",
    "checkpoint": "A checkpoint cannot be written or resumed",
    "engines": "DeepSpeed or Horovod refuse",
    "models": "The model does not fit the layout",
    "observe": "Metrics, profiles or monitoring",
    "train": "The reference trainer refuses a run",
    "tools": "plan, doctor, scale, report or monitor refuse",
    "cli": "The command line is refused",
}


def cli_reference() -> str:
    """Markdown of every `exatrain` command's --help, in the order of `exatrain --help`."""
    from exatrain.cli.main import build_parser

    parser = build_parser()
    out = [
        "# CLI reference",
        "",
        "Generated from the argument parser by `scripts/update_docs.py`; "
        "`exatrain COMMAND --help` prints the same.",
        "",
        "```text",
        _help(parser).rstrip(),
        "```",
        "",
    ]
    for name, sub in _subcommands(parser):
        out += [f"## `exatrain {name}`", "", "```text", _help(sub).rstrip(), "```", ""]
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser, prefix: str = ""):
    """(name, parser) of every subcommand, nested ones after their parent; aliases once."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:
                    continue
                seen.add(id(sub))
                yield f"{prefix}{name}", sub
                yield from _subcommands(sub, f"{prefix}{name} ")


def _help(parser: argparse.ArgumentParser) -> str:
    """`parser.format_help()` at a fixed width."""
    parser.formatter_class = _fixed_width(parser.formatter_class)
    return parser.format_help()


def _fixed_width(cls):
    return lambda prog: cls(prog, width=WIDTH, max_help_position=32)


def troubleshooting() -> str:
    """Markdown of every hint in exatrain's source, grouped by symptom, each with its message and place."""
    groups: dict[str, list[str]] = {symptom: [] for symptom in SYMPTOMS.values()}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        symptom = SYMPTOMS.get(rel.parts[0] if len(rel.parts) > 1 else "cli", SYMPTOMS["cli"])
        for _line, message, hint in hints_in(ast.parse(path.read_text())):
            groups[symptom].append(f"- **{message}**  \n  HINT: {hint}  \n  <small>`exatrain/{rel}`</small>")
    out = [
        "# Troubleshooting",
        "",
        "Every error exatrain raises says what is wrong and ends with a `HINT:` line saying how to fix it. "
        "This page lists all of them, found in the source by `scripts/update_docs.py`, grouped by what "
        "you see. `{...}` stands for a value filled in at run time (a path, a rank, a number). Search this "
        "page for a few words of the message you got.",
        "",
    ]
    for symptom, entries in groups.items():
        if entries:
            out += [f"## {symptom}", "", *entries, ""]
    return "\n".join(out)


def hints_in(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, message, hint) of each `SomethingError(message, hint)` call with both given, in source order;
    f-string parts appear as `{expression}`."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and _name(node.func).endswith("Error")
            and len(node.args) >= 2
            and all(isinstance(a, (ast.Constant, ast.JoinedStr, ast.BinOp)) for a in node.args[:2])
        ):
            found.append((node.lineno, _clean(_text(node.args[0])), _clean(_text(node.args[1]))))
    return sorted(found)


def _name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _text(node: ast.expr) -> str:
    """The readable text of a message expression: string parts as they are, other parts as `{...}`."""
    if isinstance(node, ast.Constant):
        text = str(node.value)
    elif isinstance(node, ast.JoinedStr):
        text = "".join(
            v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}" for v in node.values
        )
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        text = _text(node.left) + _text(node.right)
    else:
        text = "{" + ast.unparse(node) + "}"
    return text


def _clean(text: str) -> str:
    """One line of Markdown: whitespace runs folded, emphasis and HTML characters escaped."""
    return " ".join(text.replace("*", r"\*").replace("<", "&lt;").split())
