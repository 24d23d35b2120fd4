"""Rewrite the generated parts of the documentation site from the code: the configuration reference
(docs/configuration.md, from exatrain/config/schema.py), the CLI reference (docs/cli.md, from the argument
parser) and the troubleshooting page (docs/troubleshooting.md, from every HINT in exatrain/).

    .venv/bin/python scripts/update_docs.py

tests/unit/test_docs_generated.py fails while any of them differs from what this script writes.
"""

from pathlib import Path

from exatrain.cli.reference import cli_reference, troubleshooting
from exatrain.config import reference

DOCS = Path(__file__).resolve().parents[1] / "docs"
START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"

page = DOCS / "configuration.md"
head, rest = page.read_text().split(START, 1)
page.write_text(head + START + reference().strip() + "\n" + END + rest.split(END, 1)[1])
(DOCS / "cli.md").write_text(cli_reference())
(DOCS / "troubleshooting.md").write_text(troubleshooting())
print(f"updated {page}, {DOCS / 'cli.md'} and {DOCS / 'troubleshooting.md'}")
