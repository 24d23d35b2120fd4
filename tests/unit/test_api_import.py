"""`import exatrain` stays cheap: no torch until a torch-using name of the public API is touched."""

import subprocess
import sys


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_exatrain_does_not_import_torch():
    assert _run("import sys, exatrain; print('torch' in sys.modules, exatrain.__version__)").startswith(
        "False "
    )


def test_public_names_resolve_lazily():
    out = _run(
        "import sys, exatrain; names = exatrain.__all__; "
        "[getattr(exatrain, n) for n in names]; print('torch' in sys.modules, len(names))"
    )
    assert out.startswith("True ")
    names = (
        "init",
        "Context",
        "parallelize",
        "full_state_dict",
        "print0",
        "save0",
        "mean_across_ranks",
        "barrier",
        "DataLoader",
        "Checkpointer",
        "MetricsLog",
        "Progress",
    )
    # one interpreter for all (each import of torch costs seconds); each name still resolves on its own
    out = _run(f"import exatrain; print(*(getattr(exatrain, n).__name__ for n in {names!r}))")
    assert out.split() == list(names)


def test_unknown_name_is_an_attribute_error():
    out = _run("import exatrain\ntry:\n    exatrain.nope\nexcept AttributeError as e:\n    print(e)")
    assert "no attribute 'nope'" in out


def test_launching_process_checks_and_prepares_without_torch(tmp_path):
    """`exatrain train --nproc=2` checks the layout (ParallelDims), tokenises the corpus into its cache and
    only then starts torchrun's agent, all without importing torch: torch's import (seconds) is paid by the
    agent and the workers, not a third time before they start. The launch itself is replaced by a probe that
    records whether torch was imported by then; a pipeline layout and a real corpus cache are checked."""
    code = f"""
import sys
import exatrain.launch
seen = []
exatrain.launch.launch_local = lambda *a, **k: seen.append('torch' in sys.modules) or 0
from exatrain.cli.main import main
code = main(["train", "--nproc=2", "--run.dir={tmp_path / "run"}", "--parallel.pp=2", "--data.seq_len=16"])
print(code, seen, 'torch.distributed.pipelining' in sys.modules)
"""
    assert _run(code) == "0 [False] False"
    assert any((tmp_path / ".cache" / "data").iterdir()), "the corpus was not prepared before the launch"


def test_a_worker_without_pipeline_parallel_does_not_import_pipelining():
    """torch.distributed.pipelining pulls in torch._dynamo and torch.export (most of a second per worker):
    the trainer imports it only where a Pipeline is built."""
    out = _run(
        "import sys, exatrain.train.entry, exatrain; exatrain.Pipeline; "
        "print('torch.distributed.pipelining' in sys.modules)"
    )
    assert out == "False"
