"""Pipeline parallel (library level) on real gloo ranks against a single-process reference.

Every schedule (GPipe, 1F1B, interleaved 1F1B with 2 stages per rank) at 2 and 4 pipeline ranks trains
the same model (same seed) on the same global batches as one process: fp32, dropout 0, 2 accumulation
steps of several pipeline microbatches, gradient clipping that is active (so the clip norm must be the
whole model's, summed across stages), AdamW, 4 steps. Then: a forward-only evaluation, and the full
state dict gathered across stages, which must load into a plain TransformerLM.

Tolerances: 2e-6 absolute on every step's loss and gradient norm and on the evaluation loss, the README's
number for every layout (float summation order only; measured 2026-11-23: at most 4.8e-7); 5e-5 on every
final weight (as in the DDP parity test: AdamW magnifies summation-order noise on near-zero gradients).
"""

import json

import pytest
import torch

from exatrain.config import load_config
from exatrain.distributed import init_distributed, teardown
from exatrain.distributed.grad_norm import clip_grad_norm_
from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.distributed.pipeline import Pipeline, gather_full_state_dict, stage_ids
from exatrain.models import model_shape
from exatrain.models.pipeline_split import split_for_stages, stage_layer_ranges
from exatrain.models.transformer import TransformerLM, lm_loss
from tests.distributed.helpers import spawn

pytestmark = pytest.mark.dist

VOCAB, SEQ, GLOBAL, MICRO, STEPS, LR, CLIP = 97, 16, 8, 4, 4, 3e-3, 0.5
LOSS_TOL, WEIGHT_TOL = 2e-6, 5e-5  # the README's 2e-6 (module docstring)
# (schedule, stages per rank, blocks, pipeline microbatches per micro-batch), per pipeline degree
CASES = {
    2: [("gpipe", 1, 4, 2), ("1f1b", 1, 4, 4), ("interleaved_1f1b", 2, 4, 4)],
    4: [("gpipe", 1, 4, 4), ("1f1b", 1, 6, 4), ("interleaved_1f1b", 2, 8, 4)],
}


def _model(n_layers: int) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(model_shape("tiny", n_layers), VOCAB, SEQ)


def _batch(step: int, n: int = GLOBAL):
    g = torch.Generator().manual_seed(100 + step)
    t = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
    return t[:, :-1], t[:, 1:]


def _run_case(pp_rank, pp, pp_mesh, schedule, spr, n_layers, microbatches):
    ids = stage_ids(pp_rank, pp, spr)
    rank_model, chunks = split_for_stages(_model(n_layers), ids, pp * spr)
    group = pp_mesh.get_group()
    pipe = Pipeline(chunks, ids, pp * spr, group, torch.device("cpu"), schedule, microbatches, lm_loss)
    opt = torch.optim.AdamW(rank_model.parameters(), lr=LR)
    losses, norms = [], []
    for step in range(STEPS):
        x, y = _batch(step)
        micro = [(x[i : i + MICRO], y[i : i + MICRO]) for i in range(0, GLOBAL, MICRO)]
        losses.append(pipe.forward_backward(micro).item())
        norms.append(clip_grad_norm_(rank_model.parameters(), CLIP, pp_mesh=pp_mesh).item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    eval_loss = pipe.eval_loss(*_batch(99, MICRO)).item()
    full = gather_full_state_dict(rank_model, group)
    return {"losses": losses, "norms": norms, "eval": eval_loss}, full


def _worker(rank, world, env, out):
    torch.set_num_threads(1)
    init_distributed(env, "cpu", timeout_s=120)
    dims = ParallelDims.from_config(
        load_config(None, [f"--parallel.pp={world}", "--parallel.dp_replicate=1"]).parallel, world
    )
    dims.build_mesh("cpu")
    for schedule, spr, n_layers, mbs in CASES[world]:
        result, full = _run_case(dims.coordinate("pp"), world, dims.mesh("pp"), schedule, spr, n_layers, mbs)
        if rank == 0:
            (out / f"{schedule}.json").write_text(json.dumps(result))
            torch.save(full, out / f"{schedule}.pt")
        else:
            assert full is None
    teardown()


def _reference(n_layers: int):
    model = _model(n_layers)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for step in range(STEPS):
        loss = model(*_batch(step))
        loss.backward()
        losses.append(loss.item())
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        eval_loss = model(*_batch(99, MICRO)).item()
    return {"losses": losses, "norms": norms, "eval": eval_loss}, model


@pytest.mark.parametrize("pp", [2, 4])
def test_pipeline_schedules_match_single_process(pp, tmp_path):
    spawn(_worker, pp, tmp_path)
    for schedule, _, n_layers, _ in CASES[pp]:
        ref, ref_model = _reference(n_layers)
        got = json.loads((tmp_path / f"{schedule}.json").read_text())
        assert all(n > CLIP for n in ref["norms"]), "clipping should be active in this test"
        for key in ("losses", "norms"):
            diff = max(abs(a - b) for a, b in zip(got[key], ref[key]))
            print(f"{schedule} pp={pp} {key}: max diff {diff:.1e}")
            assert diff <= LOSS_TOL, f"{schedule} pp={pp} {key}: {got[key]} vs {ref[key]}"
        print(f"{schedule} pp={pp} eval: diff {abs(got['eval'] - ref['eval']):.1e}")
        assert abs(got["eval"] - ref["eval"]) <= LOSS_TOL, (schedule, got["eval"], ref["eval"])
        full = torch.load(tmp_path / f"{schedule}.pt", weights_only=True)
        expected = ref_model.state_dict()
        assert full.keys() == expected.keys(), schedule
        worst = max((full[k] - expected[k]).abs().max().item() for k in full)
        assert worst <= WEIGHT_TOL, f"{schedule} pp={pp}: max weight difference {worst}"
        plain = _model(n_layers)
        plain.load_state_dict(full)  # strict: the gathered dict is a whole plain model
        with torch.no_grad():
            plain_eval = plain(*_batch(99, MICRO)).item()
        print(
            f"{schedule} pp={pp}: plain model from the gathered state, eval diff "
            f"{abs(plain_eval - got['eval']):.1e}"
        )
        assert abs(plain_eval - got["eval"]) <= LOSS_TOL


def test_stage_split_is_balanced_and_keeps_names():
    assert [list(r) for r in stage_layer_ranges(7, 3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [len(r) for r in stage_layer_ranges(8, 8)] == [1] * 8
    model = _model(4)
    rank_model, chunks = split_for_stages(model, [1, 3], 4)  # interleaved rank 1 of pp=2
    assert [list(c.layers) for c in chunks] == [["1"], ["3"]]
    assert chunks[0].tok_embeddings is None and chunks[0].output is None and chunks[1].output is not None
    assert set(rank_model.state_dict()) == {
        k for k in model.state_dict() if k.startswith(("layers.1.", "layers.3.", "norm.", "output."))
    }
    assert chunks[1].output.weight is model.output.weight  # shared, not copied
    assert list(model.layers) == ["0", "1", "2", "3"]  # the source model is untouched
    x, y = _batch(0, 2)
    h = split_for_stages(model, [0], 2)[0](x)
    assert torch.allclose(split_for_stages(model, [1], 2)[0](h, y), model(x, y))
