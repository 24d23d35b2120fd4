"""models.pipeline_split: a rank's stage chunks share their blocks with the model but not their hooks.

FSDP (and replicate) register their hooks on each chunk they wrap. Chunks were shallow copies of one model
and shared its hook dicts, so a forward of one chunk ran every other chunk's FSDP hooks on the same rank:
under an interleaved schedule with FSDP, rank 0 gathered the embeddings' unit in every stage's forward and
backward (15 gathers per step instead of 7 at W = 4, pp 2 x dp_shard 2, 4 microbatches; the measured plan
of tests/unit/test_plan_search.py::test_closed_form_fsdp_inside_a_pipeline_matches_the_measured_step)."""

import torch

from exatrain.models.pipeline_split import split_for_stages
from exatrain.models.transformer import build_model


def test_a_hook_registered_on_one_chunk_runs_on_that_chunk_only():
    model = build_model("tiny", 100, 16, n_layers=4)
    _, chunks = split_for_stages(model, [0, 2], 4)
    calls = []
    for name, chunk in zip(("stage 0", "stage 2"), chunks):
        chunk.register_forward_pre_hook(lambda module, args, name=name: calls.append(name))
    tokens = torch.randint(100, (2, 16))
    hidden = chunks[0](tokens)
    assert calls == ["stage 0"]
    chunks[1](hidden)
    assert calls == ["stage 0", "stage 2"]
    model(tokens)
    assert calls == ["stage 0", "stage 2"]  # the model itself has neither hook
    assert chunks[0].layers is not chunks[1].layers and chunks[0].layers["0"] is model.layers["0"]
