"""Every test folder is collected by the README's test command (pytest's default `norecursedirs` contains
"dist", which once silently skipped a test folder of that name; it is now tests/distributed)."""

import fnmatch
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_folder_is_skipped_by_norecursedirs(pytestconfig):
    patterns = pytestconfig.getini("norecursedirs")
    folders = [p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))]
    assert {"unit", "distributed", "slurm", "e2e"} <= set(folders)
    skipped = [f for f in folders if any(fnmatch.fnmatch(f, pat) for pat in patterns)]
    assert not skipped, f"norecursedirs {patterns} skips test folders {skipped}"
