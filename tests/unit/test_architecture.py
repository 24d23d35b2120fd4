"""The layer rules of docs/architecture, checked on the source (AST), so a change that breaks them fails CI.

- each package imports only from packages in its own layer or above;
- models never imports train, checkpoint or data;
- config, env and launch import no torch (submitting from a login node stays instant);
- only env/ reads cluster variables from os.environ; only distributed/ writes os.environ.
"""

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "exatrain"
LAYERS = [{"errors", "__init__"}, {"config", "env"}, {"launch"}, {"observe"}, {"distributed"},
          {"models", "data", "checkpoint"}, {"train"}, {"cli"}]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}
CLUSTER_VAR = re.compile(r"^(SLURM|SBATCH|OMPI|PMI|PMIX|TORCHELASTIC|MPI|CUDA_VISIBLE|ROCR_VISIBLE|HIP_VISIBLE)_?")


def _modules():
    return sorted(p for p in PKG.rglob("*.py"))


def _package(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def _environ_accesses(tree: ast.AST):
    """(kind, key) for os.environ[...] reads/writes, os.environ.get/setdefault/update and os.getenv."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            key = node.slice.value if isinstance(node.slice, ast.Constant) else None
            yield ("write" if isinstance(node.ctx, (ast.Store, ast.Del)) else "read"), key
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            key = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            if func in ("os.environ.get", "os.getenv"):
                yield "read", key
            elif func in ("os.environ.update", "os.environ.setdefault", "os.environ.pop", "os.putenv"):
                yield "write", key


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_layer_rules(path):
    tree = ast.parse(path.read_text())
    pkg = _package(path)
    assert pkg in LEVEL, f"{pkg} is not in the layer table of this test (add it where docs/architecture.md puts it)"
    for name in _imports(tree):
        parts = name.split(".")
        if parts[0] == "torch" and pkg in ("config", "env", "launch"):
            pytest.fail(f"{path.name}: {pkg}/ must not import torch (imports {name})")
        if parts[0] != "exatrain" or len(parts) < 2:
            continue
        target = parts[1]
        assert LEVEL.get(target, 0) <= LEVEL[pkg], f"{pkg}/{path.name} imports {name}: a lower layer"
        if pkg == "models":
            assert target not in ("train", "checkpoint", "data"), f"models/{path.name} imports {name}"
    for kind, key in _environ_accesses(tree):
        if kind == "write":
            assert pkg == "distributed", f"{pkg}/{path.name} writes os.environ[{key!r}]: only distributed/ sets such variables"
        elif key and CLUSTER_VAR.match(key):
            assert pkg == "env", f"{pkg}/{path.name} reads cluster variable {key}: only env/ reads those"


def test_the_rules_catch_a_violation(tmp_path):
    """The checks above are not vacuous: a module that breaks each rule is caught."""
    bad = ast.parse("import os\nimport torch\nfrom exatrain.train import x\nos.environ['MASTER_ADDR'] = 'h'\n"
                    "os.environ.get('SLURM_JOB_ID')\n")
    assert "torch" in list(_imports(bad)) and "exatrain.train" in _imports(bad)
    assert ("write", "MASTER_ADDR") in list(_environ_accesses(bad))
    assert ("read", "SLURM_JOB_ID") in list(_environ_accesses(bad))
