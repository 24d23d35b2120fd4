"""Pipeline-parallel split of the reference TransformerLM into stage chunks by layer index.

A chunk is a TransformerLM that keeps only some of the full model's sub-modules: the first stage keeps
the embeddings, the last keeps the final norm and the output head, every stage keeps a consecutive run
of blocks. Missing parts are None (TransformerLM.forward then takes or returns hidden states). Chunks
SHARE their sub-modules with the model they were cut from (nothing is copied) and keep the full model's
parameter names ('layers.5.ffn.w1.weight' stays that), so state dicts, DCP checkpoints and a gathered
full state dict line up with an unsplit model.
"""

from __future__ import annotations

import copy

from torch import nn

from exatrain.models.transformer import TransformerLM


def stage_layer_ranges(n_layers: int, n_stages: int) -> list[range]:
    """Consecutive block indices of each stage, as even as possible.

    The remainder goes to the earliest stages, never to the last one, which also carries the output
    head (a D x V matmul, the most expensive non-block part)."""
    if not 1 <= n_stages <= n_layers:
        raise ValueError(f"cannot split {n_layers} blocks into {n_stages} pipeline stages")
    base, extra = divmod(n_layers, n_stages)
    ranges, start = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def keep_parts(model: TransformerLM, layers: list[int], embeddings: bool, head: bool) -> TransformerLM:
    """A view of `model` with only the given blocks, the embeddings if `embeddings`, the final norm
    and output head if `head`; the other parts are None. Shares parameters with `model`."""
    chunk = copy.copy(model)  # shallow: a new object whose dicts must not alias the model's
    # its own module, parameter and buffer dicts, and its own hook dicts: a hook registered on one chunk
    # (FSDP's, applied per chunk) must not run on another chunk of the same rank
    for attr, value in vars(model).items():
        if isinstance(value, (dict, set)):
            object.__setattr__(chunk, attr, copy.copy(value))
    chunk.layers = nn.ModuleDict({str(i): model.layers[str(i)] for i in layers})
    if not embeddings:
        chunk.tok_embeddings = chunk.pos_embeddings = None
    if not head:
        chunk.norm = chunk.output = None
    return chunk


def split_for_stages(
    model: TransformerLM, stage_ids: list[int], n_stages: int
) -> tuple[TransformerLM, list[TransformerLM]]:
    """This rank's part of `model` for pipeline stages `stage_ids` out of `n_stages`.

    Returns (rank_model, chunks): one chunk per stage, in the order of `stage_ids`, and the rank model,
    which holds all the rank's parts under their full-model names (one module for the optimizer, the
    checkpoint and the saved state dict; with one stage per rank it is that stage's chunk). A rank
    model of several stages is not a runnable network: its blocks are not consecutive."""
    ranges = stage_layer_ranges(len(model.layers), n_stages)
    last = n_stages - 1
    chunks = [keep_parts(model, list(ranges[s]), embeddings=s == 0, head=s == last) for s in stage_ids]
    if len(chunks) == 1:
        return chunks[0], chunks
    owned = [i for s in sorted(stage_ids) for i in ranges[s]]
    return keep_parts(model, owned, embeddings=0 in stage_ids, head=last in stage_ids), chunks
