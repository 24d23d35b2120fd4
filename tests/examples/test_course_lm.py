"""examples/course_lm: the JSC course script before (single.py) and after (distributed.py) exatrain.

Real processes: single.py and distributed.py as a user starts them, and distributed.py on 2 local ranks
(`exatrain run --nproc 2`, real gloo process groups), on a tiny generated WikiText-2-format directory."""

import difflib

import pytest
import torch

from tests.examples.helpers import EXAMPLES, load_module, make_data, run_example

pytestmark = pytest.mark.dist

SINGLE, DISTRIBUTED = EXAMPLES / "course_lm" / "single.py", EXAMPLES / "course_lm" / "distributed.py"
TINY = [
    "--epochs",
    "2",
    "--batch-size",
    "8",
    "--test-batch-size",
    "8",
    "--seq-len",
    "16",
    "--d-model",
    "32",
    "--n-layers",
    "2",
]


def changed_lines(before: list[str], after: list[str]) -> int:
    """Lines changed between two versions as a reader of the diff counts them: an added or a removed line
    counts 1, and a block of n lines replaced by m lines counts max(n, m) (an edited line counts once)."""
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")


def test_distributed_version_is_15_changed_lines_12_edited_and_3_added_27_diff_lines():
    """The READMEs' count: 15 changed lines (an edited line once), 12 edited and 3 added, which `diff` prints
    as 27 `<`/`>` lines (an edited line as a removed and an added one)."""
    before, after = SINGLE.read_text().splitlines(), DISTRIBUTED.read_text().splitlines()
    diff = list(difflib.unified_diff(before, after, "single.py", "distributed.py", lineterm="", n=0))
    shown = "\n".join(diff)
    assert changed_lines(before, after) == 15, shown
    ops = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    edited = sum(i2 - i1 for tag, i1, i2, j1, j2 in ops if tag == "replace")
    added = sum(
        j2 - j1 - (i2 - i1) if tag == "replace" else j2 - j1 for tag, i1, i2, j1, j2 in ops if tag != "equal"
    )
    assert (edited, added) == (12, 3), shown
    assert len([line for line in diff[2:] if line[:1] in "+-"]) == 27, shown


def test_changed_lines_counts_edits_once_and_additions_and_removals_each():
    assert changed_lines(["a", "b", "c"], ["a", "B", "c"]) == 1
    assert changed_lines(["a", "b"], ["a", "x", "y", "b"]) == 2
    assert changed_lines(["a", "b", "c"], ["a"]) == 2


@pytest.fixture(scope="module")
def wikitext(tmp_path_factory):
    return make_data.make_wikitext(tmp_path_factory.mktemp("data") / "wikitext-2", lines=(120, 40, 40))


def _final(out_dir):
    return torch.load(out_dir / "model-final.pt", weights_only=True)


def test_single_and_distributed_give_the_same_losses_on_one_process(wikitext, tmp_path):
    """Same model init, same batches (in order: torch's and exatrain's loaders shuffle differently),
    same dropout masks: the losses and the final weights are bit for bit the same."""
    args = [*TINY, "--data-dir", wikitext, "--no-shuffle"]
    run_example("course_lm/single.py", [*args, "--out-dir", tmp_path / "single"], 1, tmp_path)
    run_example("course_lm/distributed.py", [*args, "--out-dir", tmp_path / "exatrain"], 1, tmp_path)
    single, distributed = _final(tmp_path / "single"), _final(tmp_path / "exatrain")
    assert distributed["history"] == single["history"]
    assert len(single["history"]["train"]) == 2
    assert single["model"].keys() == distributed["model"].keys()
    assert all(torch.equal(single["model"][k], distributed["model"][k]) for k in single["model"])


def test_two_ranks_match_one_process(wikitext, tmp_path):
    """The same global batch split over 2 ranks (DDP): the losses averaged across ranks agree with one
    process within 1e-5 relative (fp32; without dropout, whose masks depend on how the batch is split),
    and model-final.pt loads into single.py's plain model."""
    args = [*TINY, "--data-dir", wikitext, "--dropout", "0"]
    out1 = run_example("course_lm/distributed.py", [*args, "--out-dir", tmp_path / "one"], 1, tmp_path)
    out2 = run_example("course_lm/distributed.py", [*args, "--out-dir", tmp_path / "two"], 2, tmp_path)
    one, two = _final(tmp_path / "one")["history"], _final(tmp_path / "two")["history"]
    for key in ("train", "valid"):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=0), (key, out1, out2)
    assert two["test"] == pytest.approx(one["test"], rel=1e-5, abs=0)
    assert two["valid"][-1] < two["valid"][0]  # it learns
    single = load_module(SINGLE, "course_single")
    model = single.TransformerLM(
        len(single.Vocabulary(single.read_words(wikitext / "train.txt")).itos), 32, 4, 2, 16, 0.0
    )
    model.load_state_dict(_final(tmp_path / "two")["model"])
