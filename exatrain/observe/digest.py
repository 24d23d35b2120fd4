"""A digest of the samples a step trained on, recorded in metrics.jsonl so that a resumed run can be compared
with an uninterrupted one by what it really consumed (not by recomputing the sampler under test)."""

from __future__ import annotations

import zlib

DIGEST_MOD = 2**32


def samples_digest(batches) -> int:
    """Order-free digest of the samples (rows) of token tensors `batches`: the sum of each row's CRC-32,
    modulo 2**32. Summed over the data-parallel ranks (exact in float64) and taken modulo 2**32 again, it
    names a step's global batch whatever the world size, so metrics.jsonl shows what was really trained on."""
    total = 0
    for x in batches:
        for row in x.numpy():
            total += zlib.crc32(row.tobytes())
    return total % DIGEST_MOD
