"""Bad input to the public API in a user's script: exit code 2, a message naming the problem, a HINT, no
traceback (exatrain.init installs the hook that prints an ExatrainError that way)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_environment

SCRIPT = Path(__file__).with_name("api_bad_input.py")

CASES = {
    "no_blocks": ["found no repeated blocks in Sequential", "blocks="],
    "init_twice": ["exatrain.init() was called twice", "ctx.close()"],
    # as in torch's load_state_dict: missing = the model has it, the checkpoint not; unexpected = the reverse
    "checkpoint_of_another_model": [
        "does not match the model",
        "missing: decoder.weight",
        "missing: decoder.bias",
        "unexpected: head.weight",
        "unexpected: head.bias",
        "same model",
    ],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_api_input_is_a_clear_error(case, tmp_path):
    r = subprocess.run(
        [sys.executable, str(SCRIPT), case, str(tmp_path / "run")],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "HINT: " in r.stderr
    for expected in CASES[case]:
        assert expected in r.stderr, r.stderr
