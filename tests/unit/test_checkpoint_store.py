"""Pruning of checkpoint folders: retired folders are no checkpoints from the rename on, and leftovers of a
deletion cut short are cleaned by the next run."""

from pathlib import Path

from exatrain.checkpoint.store import MARKER, clean_incomplete, complete_checkpoints, delete, retire


def _committed(root: Path, step: int) -> Path:
    path = root / f"step-{step}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"m")
    (path / "__0_0.distcp").write_bytes(b"x" * 1000)
    (path / MARKER).write_text("complete\n")
    return path


def test_retire_keeps_the_newest_and_the_protected_one(tmp_path):
    for step in (2, 4, 6, 8):
        _committed(tmp_path, step)
    retired = retire(tmp_path, keep=2, protect=tmp_path / "step-2")
    assert retired == [tmp_path / ".step-4.pruned"]
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2, 6, 8]  # renamed: no longer a checkpoint
    delete(retired)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-6", "step-8"]


def test_clean_incomplete_removes_a_deletion_cut_short(tmp_path):
    _committed(tmp_path, 6)
    retire(tmp_path, keep=0)  # keep=0: pruning is off
    assert retire(tmp_path, keep=1) == []
    leftover = _committed(tmp_path, 3).rename(tmp_path / ".step-3.pruned")  # killed before its deletion
    assert clean_incomplete(tmp_path) == [leftover]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-6"]
