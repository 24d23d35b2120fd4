"""Resume a DeepSpeed checkpoint at another world size through DeepSpeed's universal checkpoint.

ZeRO shards are cut for the number of ranks that wrote them. DeepSpeed's `ds_to_universal` rewrites them as
one file per parameter and optimizer state (`zero/NAME/{fp32,exp_avg,exp_avg_sq}.pt`), which any world size
loads with the config key `checkpoint.load_universal`. exatrain converts a committed `step-N` once, on rank 0,
into `step-N/universal` (written as `step-N/.universal.partial`, then renamed: a killed conversion is never
used and is redone), and loads from there. The universal copy is pruned with its step-N folder.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from pathlib import Path

from exatrain.checkpoint.store import fsync_dir
from exatrain.distributed import all_gather_objects, is_root
from exatrain.errors import ExatrainError

UNIVERSAL = "universal"  # step-N/universal: the converted checkpoint, a DeepSpeed load_dir with the same tag


def universal_dir(path: Path) -> Path:
    """Where the universal checkpoint of the committed checkpoint folder `path` lives."""
    return Path(path) / UNIVERSAL


def ensure_universal(path: Path, tag: str) -> Path:
    """Every rank: the universal checkpoint of `path` (converted by rank 0 unless done before); returns the
    folder to pass to DeepSpeed's load_checkpoint with `tag`. A failed conversion fails every rank alike."""
    final = universal_dir(path)
    error = None
    if is_root() and not final.is_dir():
        try:
            _convert(Path(path) / tag, final, tag)
        except Exception as exc:  # DeepSpeed's converter asserts and raises many kinds
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    error = all_gather_objects(error)[0]  # also the barrier: the other ranks read what rank 0 wrote
    if error:
        raise ExatrainError(
            f"converting checkpoint {path} to DeepSpeed's universal format failed ({error})",
            "resume with the world size that wrote it (its exatrain.json says which), or export "
            f"its weights (python {path}/zero_to_fp32.py {path} OUT_DIR) and start a new run from them",
        )
    return final


def _convert(source: Path, final: Path, tag: str) -> None:
    """Rank 0: DeepSpeed's ds_to_universal of `source` into `final/tag`, atomically (partial folder,
    rename)."""
    from deepspeed.checkpoint import ds_to_universal

    partial = final.with_name(f".{final.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # a conversion killed before its rename
    args = argparse.Namespace(
        input_folder=str(source),
        output_folder=str(partial / tag),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        # the version key Megatron-DeepSpeed writes; exatrain's model needs no TP patterns
        inject_missing_state=True,
    )
    log = io.StringIO()  # the converter prints its progress (and tqdm bars): keep it out of the run's output
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            ds_to_universal.main(args)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    partial.rename(final)
    fsync_dir(final.parent)


@contextlib.contextmanager
def loading_universal(ds_engine, universal: bool):
    """DeepSpeed's `checkpoint.load_universal` set for one load_checkpoint call, then put back.

    DeepSpeed 0.19 reads the key only inside load_checkpoint (engine.load_universal_checkpoint()), so the
    same engine loads its own shards (same world size) or a universal checkpoint (another one)."""
    config = ds_engine._config
    before = config.load_universal_checkpoint
    config.load_universal_checkpoint = universal
    try:
        yield
    finally:
        config.load_universal_checkpoint = before
