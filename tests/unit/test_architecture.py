"""The layer rules of docs/architecture.md ("Layout and tests"), checked on the source (AST), so a change that
breaks them fails CI.

- each package imports only from packages in its own layer or above (the order of LAYERS below);
- models never imports train, checkpoint or data;
- config, env and slurm import no torch, launch none at import time (submitting from a login node stays
  instant; launch's agent runs torchrun's code inside its functions);
- only env/ reads the process environment: outside env/, a read names its variable (a string or a module
  constant), never a cluster variable, and the whole environment (``os.environ.copy()``, ``dict(os.environ)``,
  passing ``os.environ`` on, iterating it) is used only at the places listed in WHOLE_ENVIRONMENT, with the
  reason; ``from os import environ`` / ``getenv`` and ``import os as x`` are followed;
- only distributed/ writes os.environ;
- the reference trainer (train/, except the plan/ analysis tool) takes no private shortcut: it never imports
  exatrain.distributed or exatrain.checkpoint (it reaches them only through the public names of
  ``import exatrain``, docs/api.md), and takes every public name (``exatrain._EXPORTS``) from ``exatrain``
  itself, never from a module of exatrain, whatever its layer (``exatrain.StepMetrics``, not
  ``from exatrain.observe.step_metrics import StepMetrics`` or ``exatrain.observe.StepMetrics``). Other
  names of exatrain's modules (config, env, data, models, observe, errors) it may import. plan/ builds
  layouts under a fake process group to measure them and may use internals.
"""

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "exatrain"
LAYERS = [
    {"errors", "files", "__init__", "_lazy"},
    {"config", "env"},
    {"slurm"},
    {"launch"},
    {"observe"},
    {"distributed"},
    {"models", "data", "checkpoint"},
    {"engines"},
    {"train"},
    {"tools"},
    {"cli", "__main__"},
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}
CLUSTER_VAR = re.compile(
    r"^(SLURM|SBATCH|OMPI|PMI|PMIX|TORCHELASTIC|MPI|CUDA_VISIBLE|ROCR_VISIBLE|HIP_VISIBLE|"
    r"MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK)(_|$)"
)
WHOLE_ENVIRONMENT = {
    "launch/local.py": "copied as the environment of the torchrun agent it starts",
    "distributed/process_group.py": "handed to env's visibility_problem, which reads it",
    "cli/run_commands.py": "copied as the environment `exatrain run` execs the user's script with",
    "tools/scale.py": "copied as the environment of the study's runs (with OMP_NUM_THREADS set)",
}
PRIVATE_TO_TRAINER = ("exatrain.distributed", "exatrain.checkpoint")  # reached through `import exatrain` only
_READ_METHODS = {"get", "__getitem__", "__contains__"}
_WRITE_METHODS = {"setdefault", "pop", "popitem", "update", "clear", "__setitem__", "__delitem__"}


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


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run at import time: the module's body and its if/try blocks, not function
    bodies."""
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        out.append(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo += [n for n in getattr(node, field, []) if isinstance(n, (ast.stmt, ast.ExceptHandler))]
    return [n for n in out if isinstance(n, ast.stmt)]


def _constants(tree: ast.AST) -> dict[str, str]:
    """Module-level NAME = "string" assignments, to resolve keys such as os.environ.get(PAUSE_HOOK)."""
    return {
        t.id: node.value.value
        for node in getattr(tree, "body", [])
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for t in node.targets
        if isinstance(t, ast.Name)
    }


def _aliases(tree: ast.AST) -> tuple[set[str], set[str], set[str]]:
    """Names bound to the os module, to os.environ(b) and to os.getenv/putenv/unsetenv."""
    mods, environs, funcs = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.asname or a.name for a in node.names if a.name == "os"}
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            environs |= {a.asname or a.name for a in node.names if a.name in ("environ", "environb")}
            funcs |= {a.asname or a.name for a in node.names if a.name in ("getenv", "putenv", "unsetenv")}
    return mods, environs, funcs


def _environ_accesses(tree: ast.AST):
    """(kind, key) for every use of the process environment: kind is read, write or whole (the mapping
    itself used: copied, iterated, passed on); key is the variable name, or None when it cannot be
    resolved."""
    mods, environs, funcs = _aliases(tree)
    consts = _constants(tree)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def key_of(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return consts.get(node.id) if isinstance(node, ast.Name) else None

    def is_environ(node):
        if isinstance(node, ast.Name):
            return node.id in environs
        return (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "environb")
            and isinstance(node.value, ast.Name)
            and node.value.id in mods
        )

    def is_env_func(node):
        if isinstance(node, ast.Name):
            return node.id in funcs
        return (
            isinstance(node, ast.Attribute)
            and node.attr in ("getenv", "putenv", "unsetenv")
            and isinstance(node.value, ast.Name)
            and node.value.id in mods
        )

    for node in ast.walk(tree):
        if is_env_func(node) and isinstance(parent.get(node), ast.Call) and parent[node].func is node:
            call = parent[node]
            name = node.id if isinstance(node, ast.Name) else node.attr
            yield ("read" if name == "getenv" else "write"), (key_of(call.args[0]) if call.args else None)
        elif is_env_func(node) and not (isinstance(parent.get(node), ast.ImportFrom)):
            yield "whole", None  # os.getenv passed around as a value
        if not is_environ(node):
            continue
        up = parent.get(node)
        if isinstance(up, ast.Subscript) and up.value is node:
            yield ("write" if isinstance(up.ctx, (ast.Store, ast.Del)) else "read"), key_of(up.slice)
        elif isinstance(up, ast.Attribute) and isinstance(parent.get(up), ast.Call) and parent[up].func is up:
            call = parent[up]
            key = key_of(call.args[0]) if call.args else None
            if up.attr in _READ_METHODS:
                yield "read", key
            elif up.attr in _WRITE_METHODS:
                yield "write", key
            else:  # copy, items, keys, values, ...
                yield "whole", None
        elif (
            isinstance(up, ast.Compare)
            and node in up.comparators
            and isinstance(up.ops[0], (ast.In, ast.NotIn))
        ):
            yield "read", key_of(up.left)
        else:
            yield "whole", None


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_layer_rules(path):
    tree = ast.parse(path.read_text())
    pkg = _package(path)
    assert pkg in LEVEL, (
        f"{pkg} is not in the layer table of this test (add it to LAYERS where docs/architecture.md's "
        '"Layout and tests" section places it, and list it there)'
    )
    for name in _imports(tree):
        parts = name.split(".")
        if parts[0] == "torch" and pkg in ("config", "env", "slurm"):
            pytest.fail(f"{path.name}: {pkg}/ must not import torch (imports {name})")
        if parts[0] != "exatrain" or len(parts) < 2:
            continue
        target = parts[1]
        assert LEVEL.get(target, 0) <= LEVEL[pkg], f"{pkg}/{path.name} imports {name}: a lower layer"
        if pkg == "models":
            assert target not in ("train", "checkpoint", "data"), f"models/{path.name} imports {name}"
    if pkg == "launch":  # its agent runs torchrun's code in a child process: torch inside functions only
        top = [
            n
            for n in _imports(ast.Module(body=_module_level(tree), type_ignores=[]))
            if n.split(".")[0] == "torch"
        ]
        assert not top, (
            f"launch/{path.name} imports {top[0]} at import time: import it inside the function that needs it"
        )
    rel = str(path.relative_to(PKG))
    for kind, key in _environ_accesses(tree):
        if kind == "write":
            assert pkg == "distributed", (
                f"{rel} writes os.environ[{key!r}]: only distributed/ sets such variables"
            )
        elif pkg == "env":
            continue
        elif kind == "whole":
            assert rel in WHOLE_ENVIRONMENT, (
                f"{rel} uses the whole process environment: only env/ reads it "
                "(pass values in from env/, or list the place in WHOLE_ENVIRONMENT with the reason)"
            )
        elif key is None:
            pytest.fail(
                f"{rel} reads an environment variable whose name this test cannot resolve: name it with "
                "a string or a module-level constant"
            )
        else:
            assert not CLUSTER_VAR.match(key), f"{rel} reads cluster variable {key}: only env/ reads those"


def _private_shortcuts(tree: ast.AST) -> list[str]:
    """Imports a module of the reference trainer may not make: exatrain.distributed / exatrain.checkpoint
    modules, and public names of `exatrain` (its lazy exports) taken from any module of exatrain instead of
    `exatrain` itself: imported by name, or reached as an attribute of such a module."""
    import exatrain

    public = set(exatrain._EXPORTS)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(PRIVATE_TO_TRAINER)]
        elif isinstance(node, ast.ImportFrom) and node.module == "exatrain" and node.level == 0:
            found += [f"exatrain.{a.name}" for a in node.names if f"exatrain.{a.name}" in PRIVATE_TO_TRAINER]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.startswith("exatrain.")
        ):
            if node.module.startswith(PRIVATE_TO_TRAINER):
                found.append(node.module)
            else:
                found += [f"{node.module}.{a.name}" for a in node.names if a.name in public]
    found += _shortcuts_through_attributes(tree, public)
    return found


def _exatrain_bindings(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted exatrain path it is bound to by an import (`import exatrain.observe.metrics as
    m`: m -> exatrain.observe.metrics; `from exatrain import observe`: observe -> exatrain.observe)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "exatrain":
                    bound[a.asname] = a.name if a.asname else None
                    bound.setdefault("exatrain", "exatrain")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "exatrain"
        ):
            bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    bound.pop(None, None)
    return bound


def _shortcuts_through_attributes(tree: ast.AST, public: set[str]) -> list[str]:
    """`exatrain.observe.MetricsLog`, `m.StepMetrics` (m a module of exatrain): a public name reached as an
    attribute of a module of exatrain other than `exatrain` itself; and `exatrain.distributed` /
    `exatrain.checkpoint` reached as attributes of `exatrain`."""
    bound = _exatrain_bindings(tree)

    def dotted(node) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = dotted(node.value)
        if base and (
            node.attr in public and base != "exatrain" or f"{base}.{node.attr}" in PRIVATE_TO_TRAINER
        ):
            found.append(f"{base}.{node.attr}")
    return found


_TRAINER = sorted(
    p for p in (PKG / "train").rglob("*.py") if "plan" not in p.relative_to(PKG / "train").parts
)


@pytest.mark.parametrize("path", _TRAINER, ids=lambda p: str(p.relative_to(PKG)))
def test_the_reference_trainer_uses_only_the_public_api(path):
    """docs/api.md: the reference trainer is built on the public API, no private shortcut a user could not
    take."""
    shortcuts = _private_shortcuts(ast.parse(path.read_text()))
    assert not shortcuts, (
        f"{path.relative_to(PKG)} imports {', '.join(shortcuts)}: use the public name "
        "(exatrain.<name>, docs/api.md), or make what it needs public there"
    )


def test_the_trainer_rule_catches_a_shortcut():
    bad = ast.parse(
        "import exatrain.distributed.grad_norm\nfrom exatrain.checkpoint.store import latest\n"
        "from exatrain.data import GlobalBatchSampler, make_batch\nfrom exatrain.models import build_model\n"
        "def f():\n    from exatrain.distributed import seed_everything\n"
    )
    assert sorted(_private_shortcuts(bad)) == [
        "exatrain.checkpoint.store",
        "exatrain.data.GlobalBatchSampler",
        "exatrain.distributed",
        "exatrain.distributed.grad_norm",
    ]


def test_the_trainer_rule_catches_a_public_name_from_any_module():
    """Every layer counts: observe and errors too, by name or as a module's attribute (and
    exatrain.distributed / exatrain.checkpoint however they are reached); the top-level name and the modules'
    other names pass."""
    bad = ast.parse(
        "import exatrain\nimport exatrain.observe.progress as progress\nfrom exatrain import observe\n"
        "from exatrain.observe.step_metrics import StepMetrics\n"
        "from exatrain.observe import MetricsLog, write_json\n"
        "from exatrain.errors import ConfigError, ExatrainError\n"
        "bar = progress.Progress(3)\nlog = observe.MetricsLog('m.jsonl')\n"
        "sm = exatrain.observe.step_metrics.StepMetrics()\n"
        "from exatrain import checkpoint\nexatrain.distributed.barrier()\n"
    )
    assert sorted(_private_shortcuts(bad)) == [
        "exatrain.checkpoint",
        "exatrain.distributed",
        "exatrain.distributed.barrier",
        "exatrain.errors.ExatrainError",
        "exatrain.observe.MetricsLog",
        "exatrain.observe.MetricsLog",
        "exatrain.observe.progress.Progress",
        "exatrain.observe.step_metrics.StepMetrics",
        "exatrain.observe.step_metrics.StepMetrics",
    ]
    good = ast.parse(
        "import exatrain\nfrom exatrain import StepMetrics\nfrom exatrain.observe import write_json\n"
        "from exatrain.errors import ConfigError\nfrom exatrain.env import detect_environment\n"
        "m = exatrain.StepMetrics(); log = exatrain.MetricsLog('m.jsonl'); exatrain.ExatrainError('a', 'b')\n"
        "ctx = exatrain.init(); ctx.dims.describe(); detect_environment().kind\n"
    )
    assert _private_shortcuts(good) == []
    assert _TRAINER and not any("plan" in p.relative_to(PKG).parts for p in _TRAINER)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import os\nos.environ['MASTER_ADDR'] = 'h'", ("write", "MASTER_ADDR")),
        ("import os\nos.environ.get('SLURM_JOB_ID')", ("read", "SLURM_JOB_ID")),
        ("from os import environ\nenviron['SLURM_PROCID']", ("read", "SLURM_PROCID")),
        ("from os import environ as e\ne.get('SLURM_NTASKS', '1')", ("read", "SLURM_NTASKS")),
        ("import os as o\no.getenv('OMPI_COMM_WORLD_RANK')", ("read", "OMPI_COMM_WORLD_RANK")),
        ("from os import getenv\ngetenv('PMI_RANK')", ("read", "PMI_RANK")),
        ("import os\n'SLURM_JOB_ID' in os.environ", ("read", "SLURM_JOB_ID")),
        ("import os\nKEY = 'SLURM_JOB_ID'\nos.environ[KEY]", ("read", "SLURM_JOB_ID")),
        ("import os\nos.environ.copy()", ("whole", None)),
        ("import os\ndict(os.environ)", ("whole", None)),
        ("import os\n{**os.environ}", ("whole", None)),
        ("import os\nfor k in os.environ: pass", ("whole", None)),
        ("from os import environ\nf(environ)", ("whole", None)),
        ("import os\nos.environ.update(A='1')", ("write", None)),
        ("import os\nos.putenv('RANK', '0')", ("write", "RANK")),
        ("import os\nos.environ.get(name)", ("read", None)),
    ],
)
def test_the_rules_catch_each_way_of_touching_the_environment(source, expected):
    """The environment checks are not vacuous: each spelling of a read or write is seen with its key."""
    assert expected in list(_environ_accesses(ast.parse(source)))


def test_the_rules_ignore_a_parameter_named_environ():
    """env/ functions take an `environ` mapping argument; outside `from os import environ` it is not os's."""
    assert list(_environ_accesses(ast.parse("def f(environ):\n    return environ.get('SLURM_JOB_ID')"))) == []


def test_the_import_rules_catch_a_violation():
    bad = ast.parse("import os\nimport torch\nfrom exatrain.train import x\n")
    assert "torch" in list(_imports(bad)) and "exatrain.train" in _imports(bad)
