"""Rewrite README.md's configuration reference from the code (run after changing exatrain/config/schema.py).

    .venv/bin/python scripts/update_readme_reference.py
"""

from pathlib import Path

from exatrain.config import reference

START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"

readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
head, rest = text.split(START, 1)
readme.write_text(head + START + reference().strip() + "\n" + END + rest.split(END, 1)[1])
print(f"updated {readme}")
