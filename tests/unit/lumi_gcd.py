"""LUMI-G node topology written down independently of the code under test, from the course seed
(/work/shared/docs/slurm-facts.md, "Affinity (LUMI-G, from the seeds)"): the 64-core CPU has 8 CCDs of 8
cores (CCD c = cores 8c..8c+7), core 0 of each CCD is reserved for the OS, and GCD g is wired to CCD
GCD_TO_CCD[g]. Tests derive the expected CPU masks from this table instead of copying the profile's hex."""

GCD_TO_CCD = (6, 7, 2, 3, 0, 1, 4, 5)
CORES_PER_CCD = 8


def gcd_cores(gcd: int) -> set[int]:
    """The usable cores of the CCD next to `gcd` (the CCD's first core is reserved)."""
    first = GCD_TO_CCD[gcd] * CORES_PER_CCD
    return set(range(first + 1, first + CORES_PER_CCD))


def gcd_mask(gcd: int) -> int:
    """The CPU mask (bit i = core i) of `gcd`'s usable cores."""
    return sum(1 << core for core in gcd_cores(gcd))
