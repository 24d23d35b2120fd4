"""Let PyPI's torchvision (a CUDA build) import on a CPU-only torch; installed by scripts/install.sh.

Why: torchvision on PyPI for Linux x86_64 is built against CUDA torch. Next to the CPU torch wheel its C++
operator library (_C.so, needing libtorch_cuda) cannot load, which torchvision tolerates, but its import
then registers Python fallbacks for the operators ``torchvision::nms`` and ``qnms`` that were never defined
and fails with "operator torchvision::nms does not exist" (pytorch/vision#9077). Transformers imports
torchvision whenever it is installed, so it fails too. The matching fix is the +cpu torchvision wheel from
PyTorch's own index, which machines that reach only PyPI cannot get.

What: `scripts/install.sh` copies this file into the venv's site-packages as
``_exatrain_torchvision_cpu.py`` with a one-line ``.pth`` file that imports it at interpreter start, only
when it has seen exactly that failure. At start it only adds a finder to ``sys.meta_path`` (no torch
import); on the first ``import torchvision`` it tries to load torchvision's operators and, when
that fails as expected, defines the two operator schemas (no kernels), so that
torchvision imports. Models, datasets and transforms work as usual; the detection operators (nms,
roi_align, ...) stay unavailable on CPU, as they were.
"""

import importlib.abc
import sys

_KEEP = []  # the torch.library fragment must stay alive, or its definitions are removed again


def _define_missing_schemas() -> None:
    import importlib.machinery
    from pathlib import Path

    import torch

    spec = importlib.machinery.PathFinder.find_spec("torchvision")
    try:  # torch changed since install.sh looked: the operators may load now, and must not be defined twice
        torch.ops.load_library(str(Path(spec.origin).parent / "_C.so"))
        return
    except (OSError, AttributeError, TypeError):
        pass
    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    """Runs once, before torchvision's own import; then leaves the import to the normal finders."""

    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            _define_missing_schemas()
        return None


sys.meta_path.insert(0, _TorchvisionFinder())
