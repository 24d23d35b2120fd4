"""The documentation site (issue "House in order"): it builds with `mkdocs build --strict`, its generated
pages (CLI reference, troubleshooting, configuration reference) are what the code produces today, the README
stays short, and no two modules share a base name unless their docstrings name each other (one concept in two
layers, or one role in each engine package)."""

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from exatrain.cli.reference import cli_reference, hints_in, troubleshooting

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REGENERATE = "regenerate with: .venv/bin/python scripts/update_docs.py"


def test_mkdocs_builds_strict(tmp_path):
    """Every page is in the navigation, every link between pages resolves, the theme and extensions load."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "troubleshooting" / "index.html").is_file()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The strict build is not vacuous: the same site with one link to a missing page fails."""
    site = tmp_path / "repo"
    site.mkdir()
    (site / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text())
    subprocess.run(["cp", "-r", str(DOCS), str(site / "docs")], check=True)
    page = site / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "out")],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0 and "no-such-page.md" in r.stdout + r.stderr


def test_cli_reference_is_generated_from_the_parser():
    assert (DOCS / "cli.md").read_text() == cli_reference(), REGENERATE


def test_troubleshooting_lists_every_hint_of_the_code():
    assert (DOCS / "troubleshooting.md").read_text() == troubleshooting(), REGENERATE


def test_the_hint_scanner_finds_hints_in_every_form():
    tree = ast.parse(
        'raise ConfigError(f"key {k!r} bad", "use " + "x")\nExatrainError("a", "b")\n'
        'ValueError("not ours")\nraise errors.DataError("m " "n", f"h {1 + 2}")\n'
    )
    assert [(m, h) for _, m, h in hints_in(tree)] == [
        ("key {k} bad", "use x"),
        ("a", "b"),
        ("m n", "h {1 + 2}"),
    ]


def test_readme_is_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def _docstring_names(path: Path, other: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    rel = other.relative_to(ROOT / "exatrain")
    return str(rel) in doc


def test_modules_share_a_base_name_only_with_the_reason_in_their_docstrings():
    by_name = defaultdict(list)
    for path in sorted((ROOT / "exatrain").rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            by_name[path.name].append(path)
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    for paths in shared.values():
        for path in paths:
            for other in paths:
                assert other == path or _docstring_names(path, other), (
                    f"{path.relative_to(ROOT)} shares its name with {other.relative_to(ROOT)}: "
                    "rename one, or, when "
                    f"they are one concept in two layers, name the other in each docstring and say why"
                )
    assert set(shared) >= {"affinity.py", "local.py"}, "the list of shared names this test guards changed"
