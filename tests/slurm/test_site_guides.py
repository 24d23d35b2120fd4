"""The per-site guides (docs/sites/lumi-g.md, juwels-booster.md, jureca-dc.md) run, block by block, on the
matching site twin of the SLURM test cluster (docs/sites/twins.md).

Every ```bash block preceded by `<!-- twin: SITE -->` (or `<!-- twin: SITE; NOTE -->`) runs here, in page
order, as one terminal session on a login node: each block starts with the environment and working directory
the previous one left (exported variables and `cd` carry over, as in a shell). The ```toml blocks of the page
whose first line is `# NAME.toml` are written into the session's folder first. The three pages' sessions run
side by side (each on its own twin). Every job a block submits (`submitted job N` in its output) is waited for
with the cluster fixture once all blocks ran. A ```text block after a twin block (before any other block or
heading) lists output lines the block promises: each must appear in its output. Each job must end COMPLETED
and leave, in its run directory, `summary.json` with one rank per node (the substitution below) and the
weights in sync on every rank, and the trained weights `final.pt`.

Substituted, and nothing else (SUBSTITUTIONS, PRELUDE and FAST below; docs/sites/twins.md repeats it):
- Site paths -> twin paths: LUMI's AI Factory image (/appl/local/laifs/containers/...sif) -> the `aif` image
  tree of tests/containers/images.py; LUMI's older image (/appl/local/containers/sif-images/...sif) -> its
  `conda` tree; /project/project_465000123 and /scratch/project_465000123 -> the LUMI-like workspace (links
  into a /pfs tree, tests/containers/images.py lumi_tree); a JSC image ($PROJECT/containers/...sif) -> the
  `aif` tree (an image whose Python is on PATH, as NVIDIA's PyTorch images); JSC's $PROJECT -> a folder of
  the twin workspace (not under any path the runtime binds by default).
- `module`: JSC's `module load ... PyTorch` puts the twin's torch on PYTHONPATH (this venv's site-packages,
  as JSC's EasyBuild modules prepend theirs); LUMI's `module use`/`module load lumi-aif-singularity-bindings`
  sets SINGULARITY_BIND to the twin workspace's roots (/pfs, /scratch, /project, /flash), which is what the
  real module binds that exists here. Other module commands do nothing.
- The lumi-g profile in container jobs: a copy whose container_binds are the twin workspace's roots (the
  real list names /appl, /opt/cray, /usr/lib64/libcxi.so.1 and /var/spool/slurmd, absent here).
- Size: every `exatrain submit` gets --job.gpus_per_node=1 (one rank per node: this machine has 2 cores)
  and a short training (FAST: 6 steps, seq_len 16, no evaluation); `exatrain doctor` gets --device=cpu and
  `srun --ntasks-per-node=N` becomes one task per node: the twins' GPUs are declared to SLURM, not real
  (blocks whose note says "gpu" are the ones that need a real GPU on the site).
- `module load cray-python` (LUMI) puts the Python this test venv was made from first on PATH.
- The login node: every page installs exatrain itself, as written, from a fresh copy of this checkout's
  tracked files (the session's folder; LUMI's under the twin's /project/<project>): JSC's into a venv over the
  module's torch, LUMI's into a torch-free venv in ~/exatrain-login (HOME is a fresh folder; python-hostlist,
  rich and the build's setuptools come from PyPI, which CI reaches). This test venv's exatrain is not on PATH.

Not reproduced: GPUs, RCCL/NCCL and the fabrics (the twins' gloo on CPU; docs/sites/twins.md), SIF images
(the container twin runs image trees; docs/sites/containers.md), the sites' real module trees and Python.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.containers.images import session_images, session_root, session_workspace, twin_env
from tests.slurm.test_submit import ROOT

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap")]

PAGES = {
    "lumi-g": "docs/sites/lumi-g.md",
    "juwels-booster": "docs/sites/juwels-booster.md",
    "jureca-dc": "docs/sites/jureca-dc.md",
}
TWIN_BLOCK = re.compile(
    r"<!-- twin: (?P<site>[\w-]+)(?:; (?P<note>[^>]*?))? -->\n```bash\n(?P<body>.*?)\n```"
    r"(?:\n\n(?:(?!```|<!--|#)[^\n]*\n)*?\n?```text\n(?P<shows>.*?)\n```)?",  # prose, then what it prints
    re.S,
)
TOML_FILE = re.compile(r"```toml\n(# (?P<name>[\w.-]+\.toml)\n.*?)\n```", re.S)
FAST = "--job.gpus_per_node=1 --train.steps=6 --data.seq_len=16 --train.eval_every=0 --train.eval_batches=1"
PROJECT = "project_465000123"


def twin_blocks(page: str) -> list[dict]:
    """The twin-marked bash blocks of a page, in order, each with the output lines it promises."""
    text = (ROOT / PAGES[page]).read_text()
    return [m.groupdict() for m in TWIN_BLOCK.finditer(text)]


def _toml_files(page: str) -> dict[str, str]:
    text = (ROOT / PAGES[page]).read_text()
    return {m["name"]: m.group(1) + "\n" for m in TOML_FILE.finditer(text)}


def _site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def _substitutions() -> list[tuple[str, str]]:
    """(regex, replacement) pairs turning site paths into the twin's (the docstring's table)."""
    images, ws = session_images(), session_workspace()
    return [
        (r"/appl/local/laifs/containers/\S+?\.sif", str(images["aif"])),
        (r"/appl/local/containers/sif-images/\S+?\.sif", str(images["conda"])),
        (r"\$PROJECT/containers/\S+?\.sif", str(images["aif"])),
        (rf"/project/{PROJECT}", str(ws["project"])),
        (rf"/scratch/{PROJECT}", str(ws["scratch"])),
    ]


def _substitute(text: str, subs: list[tuple[str, str]]) -> str:
    for pattern, repl in subs:
        text = re.sub(pattern, lambda _m, r=repl: r, text)
    return text


def _sized(body: str) -> str:
    """FAST on every `exatrain submit`, --device=cpu on `exatrain doctor`, one task per node for srun (the
    twins' nodes share this machine's 2 cores and have no GPU)."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        if "exatrain submit" in line and "--dry-run" not in line:
            line = re.sub(r"\s+#.*$", "", line) + " " + FAST  # last: wins over the line's own values
        line = re.sub(r"(exatrain doctor\b)", r"\1 --device=cpu", line)
        line = re.sub(r"--ntasks-per-node=\d+", "--ntasks-per-node=1", line)
        out.append(line)
    return "\n".join(out)


PRELUDE = r"""
module() {  # the twin's Lmod: see tests/slurm/test_site_guides.py
  [ "$1" = load ] || return 0
  shift
  for m in "$@"; do
    case "$m" in
      PyTorch*) export PYTHONPATH="$TWIN_TORCH${PYTHONPATH:+:$PYTHONPATH}" ;;
      lumi-aif-singularity-bindings*) export SINGULARITY_BIND="$TWIN_BINDS" ;;
      cray-python*) export PATH="$TWIN_PYTHON:$PATH" ;;
    esac
  done
}
"""


def _twin_profile(folder: Path) -> Path:
    """The lumi-g profile with the twin workspace's roots as its container_binds (docstring)."""
    ws = session_workspace()
    binds = ", ".join(f'"{ws[k]}"' for k in ("pfs_root", "scratch_root", "project_root", "flash_root"))
    text = (ROOT / "exatrain/slurm/profiles/lumi-g.toml").read_text()
    text = re.sub(r"container_binds = \[[^\]]*\]", f"container_binds = [{binds}]", text)
    path = folder / "twin-lumi-g.toml"
    path.write_text(text)
    return path


def _session_folder(page: str, base: Path) -> Path:
    """A fresh copy of this checkout's tracked files: LUMI's in /project/<project> (a link into /pfs)."""
    folder = session_workspace()["project"] / "exatrain" if page == "lumi-g" else base / page / "exatrain"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    return folder


def _session_env(cluster, page: str, jsc_project: Path) -> dict[str, str]:
    ws = session_workspace()
    env = dict(cluster.env)  # the cluster's SLURM_CONF, no variables of an enclosing job
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = twin_env()["PATH"]  # the container twin's singularity/apptainer, this venv's bin
    # exatrain only from the venv the guide creates
    path = [p for p in env["PATH"].split(":") if p != str(Path(sys.executable).parent)]
    home = session_root() / f"home-{page}"
    home.mkdir(exist_ok=True)
    env.update(
        PATH=":".join(path),
        HOME=str(home),
        TWIN_PYTHON=str(Path(sys.base_prefix) / "bin"),
        TWIN_TORCH=_site_packages(),
        TWIN_BINDS=",".join(str(ws[k]) for k in ("pfs_root", "scratch_root", "project_root", "flash_root")),
        PROJECT=str(jsc_project),
        PYTHONPATH="",
    )
    return env


def run_page(cluster, page: str, base: Path) -> dict:
    """Run a page's twin blocks in order; returns {folder, blocks: [(block, run_as, output, rc)], jobs}."""
    jsc_project = session_root() / f"jsc-{page}"
    (jsc_project / "containers").mkdir(parents=True, exist_ok=True)
    folder = _session_folder(page, base)
    subs = _substitutions()
    for name, text in _toml_files(page).items():
        (folder / name).write_text(_substitute(text, subs))
    if page == "lumi-g":
        twin = _twin_profile(folder)
        for name in _toml_files(page):
            text = (folder / name).read_text()
            if "container_image" in text:
                (folder / name).write_text(text.replace('profile = "lumi-g"', f'profile = "{twin}"'))
    state, cwd_file = base / f"{page}.env", base / f"{page}.cwd"
    env = _session_env(cluster, page, jsc_project)
    state.write_text("")
    cwd_file.write_text(str(folder))
    done, jobs = [], []
    for block in twin_blocks(page):
        run_as = _sized(_substitute(block["body"], subs))
        script = base / f"{page}-block.sh"
        script.write_text(
            f'source {state}\ncd "$(cat {cwd_file})"\n{PRELUDE}\nset -eo pipefail\n{run_as}\n'
            f"export -p > {state}\npwd > {cwd_file}\n"
        )
        start = time.monotonic()
        r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=400)
        out = r.stdout + r.stderr
        done.append((block, run_as, out, r.returncode))
        print(f"{page}: {time.monotonic() - start:5.1f} s  {run_as.splitlines()[-1][:90]}", file=sys.stderr)
        jobs += [
            (block, job, Path(log))
            for job, log in re.findall(r"submitted job (\d+)\n(?:.*\n)*?\s+stdout\s+(\S+)", out)
        ]
        if r.returncode:
            break
    return {"folder": folder, "blocks": done, "jobs": jobs}


@pytest.fixture(scope="module")
def guide_runs(slurm_cluster, tmp_path_factory):
    """Every page's blocks run (jobs submitted), then every job waited for: {page: run_page() + states}."""
    if not {"nid005001", "jwb0001", "jrc1"} <= set(slurm_cluster.site_nodes):
        pytest.skip("the testbed was started without its site twins (STB_SITES=0)")
    base = tmp_path_factory.mktemp("guides")
    session_images(), session_workspace()  # built once, before the pages' threads share them
    with ThreadPoolExecutor(len(PAGES)) as pool:  # three twins: the pages' sessions run side by side
        futures = {page: pool.submit(run_page, slurm_cluster, page, base) for page in PAGES}
        runs = {page: f.result() for page, f in futures.items()}
    for run in runs.values():
        run["states"] = {job: slurm_cluster.wait(job, timeout=600) for _, job, _ in run["jobs"]}
        run["nodes"] = {job: int(slurm_cluster.job_info(job)[0]["NumNodes"]) for _, job, _ in run["jobs"]}
    return runs


def _read(log: Path) -> str:
    return log.read_text() if log.is_file() else f"(no {log})"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_guide_blocks_run_on_the_twin(guide_runs, slurm_cluster, page):
    """Each block exits 0 and prints the lines the page shows below it; each job it submitted COMPLETED."""
    run = guide_runs[page]
    assert run["blocks"], f"{PAGES[page]} has no <!-- twin: {page} --> blocks"
    assert len(run["blocks"]) == len(twin_blocks(page)), "a block failed (see the failure below)"
    for block, run_as, out, rc in run["blocks"]:
        assert block["site"] == page, f"{PAGES[page]}: a block marked for twin {block['site']}"
        assert rc == 0, f"{PAGES[page]}: block failed:\n{block['body']}\n(run as:\n{run_as})\n{out[-4000:]}"
        for line in _substitute(block["shows"] or "", _substitutions()).splitlines():
            assert line.strip() in out, f"{PAGES[page]}: {line!r} not printed by:\n{block['body']}\n{out}"
    for block, job, log in run["jobs"]:
        assert run["states"][job] == "COMPLETED", f"{block['body']}\njob {job}:\n{_read(log)[-4000:]}"


def _summaries(run) -> list[tuple[dict, dict, str]]:
    """(block, summary.json, job) of each reference-trainer job whose run dir (named in its log) holds
    summary.json and the trained weights (final.pt), as the guides say."""
    found = []
    for block, job, log in run["jobs"]:
        run_dir = re.search(r"run dir (\S+)", _read(log))
        summary = Path(run_dir.group(1)) / "summary.json" if run_dir else None
        if summary and summary.is_file() and (summary.parent / "final.pt").is_file():
            found.append((block, json.loads(summary.read_text()), job))
    return found


@pytest.mark.parametrize("page", sorted(PAGES))
def test_guide_jobs_train_one_rank_per_node(guide_runs, slurm_cluster, page):
    """Every job trained the reference model on as many ranks as it had nodes (one rank per node on the twin),
    in sync; the page's jobs include a one-node and a two-node job, a container job and a torchrun job."""
    run = guide_runs[page]
    summaries = _summaries(run)
    assert len(summaries) == len(run["jobs"]) >= 4, [b["body"] for b, _, _ in run["jobs"]]
    for block, summary, job in summaries:
        assert summary["world_size"] == run["nodes"][job] and summary["weights_in_sync"], (
            block["body"],
            summary,
        )
    worlds = sorted({s["world_size"] for _, s, _ in summaries})
    assert worlds == [1, 2], worlds
    scripts = [
        Path(m).read_text() for _, _, o, _ in run["blocks"] for m in re.findall(r"script\s+(\S+\.sbatch)", o)
    ]
    assert any("torchrun" in s and "--rdzv-backend=c10d" in s for s in scripts), "no torchrun-mode job"
    assert any(re.search(r"(singularity|apptainer) (run|exec) --bind", s) for s in scripts), (
        "no container job"
    )


def test_twin_blocks_are_exactly_the_marked_ones():
    """The convention shared with tests/e2e/test_readme.py: every bash block of a guide is either a
    `<!-- twin: SITE -->` block of its own site (run here, left out by test_readme.py) or marked not-in-ci
    with a reason (none is); each block that trains or runs the doctor says that it
    needs a GPU on the site (`gpu: ...`)."""
    from tests.e2e.test_readme import RUNNABLE, _blocks

    for page, name in PAGES.items():
        blocks = twin_blocks(page)
        assert len(blocks) >= 7, f"{name}: the guide lost its steps"
        assert {b["site"] for b in blocks} == {page}, name
        bash = [b for b in _blocks(name) if b["lang"] == "bash"]
        skipped = [b for b in bash if b["reason"] and not b["twin"]]
        assert len(bash) == len(blocks) + len(skipped), f"{name}: a bash block is neither twin nor not-in-ci"
        assert not skipped, [b["body"] for b in skipped]
        for b in blocks:
            needs_gpu = "exatrain submit" in b["body"] or "exatrain doctor" in b["body"]
            assert needs_gpu == (b["note"] or "").startswith("gpu:"), (name, b["body"])
    marked = {b["body"] for p in PAGES for b in twin_blocks(p)}
    assert marked and not marked & {b["body"] for b in RUNNABLE}
