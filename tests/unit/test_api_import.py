"""`import exatrain` stays cheap: no torch until a torch-using name of the public API is touched."""

import subprocess
import sys


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_exatrain_does_not_import_torch():
    assert _run("import sys, exatrain; print('torch' in sys.modules, exatrain.__version__)").startswith("False ")


def test_public_names_resolve_lazily():
    out = _run("import sys, exatrain; names = exatrain.__all__; "
               "[getattr(exatrain, n) for n in names]; print('torch' in sys.modules, len(names))")
    assert out.startswith("True ")
    names = ("init", "Context", "parallelize", "full_state_dict", "print0", "save0", "mean_across_ranks",
             "barrier", "DataLoader", "Checkpointer", "MetricsLog", "Progress")
    # one interpreter for all (each import of torch costs seconds); each name still resolves on its own
    out = _run(f"import exatrain; print(*(getattr(exatrain, n).__name__ for n in {names!r}))")
    assert out.split() == list(names)


def test_unknown_name_is_an_attribute_error():
    out = _run("import exatrain\ntry:\n    exatrain.nope\nexcept AttributeError as e:\n    print(e)")
    assert "no attribute 'nope'" in out
