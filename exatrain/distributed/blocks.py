"""Find a model's repeated blocks: the units FSDP shards, activation checkpointing recomputes and
torch.compile compiles one at a time.

A candidate is a group of two or more same-class children of one module, each with submodules and
parameters of its own: the children of an `nn.ModuleList`/`nn.ModuleDict` (a Hugging Face decoder's
`layers`/`h`), or same-class siblings (torchvision ResNet's `layer1..layer4` stages). The chosen group is
the one holding the most parameters (then the most blocks, then the shallowest). Single layers (a Linear,
a Conv2d) are never blocks.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from exatrain.errors import ExatrainError


class Blocks:
    """A model's blocks as a mapping {qualified name: module} whose items can be replaced in the model
    (`blocks[name] = wrapped` sets the attribute on the parent), like an nn.ModuleDict of them."""

    def __init__(self, slots: list[tuple[nn.Module, str, str]]):
        self._slots = {qualified: (parent, attr) for parent, attr, qualified in slots}

    def keys(self) -> list[str]:
        return list(self._slots)

    def values(self) -> list[nn.Module]:
        return [self[k] for k in self._slots]

    def items(self) -> list[tuple[str, nn.Module]]:
        return [(k, self[k]) for k in self._slots]

    def __getitem__(self, name: str) -> nn.Module:
        parent, attr = self._slots[name]
        return getattr(parent, attr)

    def __setitem__(self, name: str, module: nn.Module) -> None:
        parent, attr = self._slots[name]
        setattr(parent, attr, module)

    def __len__(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)


def find_blocks(model: nn.Module, blocks=None) -> Blocks:
    """The blocks of `model`: auto-detected (`blocks=None`), the children of the submodule named by a dotted
    string (`"model.layers"`), or the given list of submodules (`[]`: none, the model is one unit)."""
    if blocks is None:
        return detect_blocks(model)
    names = {id(m): n for n, m in model.named_modules()}
    if isinstance(blocks, str):
        container = _submodule(model, blocks)
        return Blocks([(container, attr, f"{blocks}.{attr}") for attr, _ in container.named_children()])
    slots = []
    for m in blocks:
        if not isinstance(m, nn.Module) or id(m) not in names or m is model:
            raise ExatrainError(
                f"parallelize(blocks=...): {type(m).__name__} is not a submodule of the model",
                "pass submodules of the model (e.g. list(model.layers)) or the dotted name of their "
                "container (blocks='layers')",
            )
        qualified = names[id(m)]
        parent_name, _, attr = qualified.rpartition(".")
        slots.append((model.get_submodule(parent_name), attr, qualified))
    return Blocks(slots)


def detect_blocks(model: nn.Module) -> Blocks:
    """The group of same-class child modules holding the most parameters (see the module docstring);
    ExatrainError naming the `blocks=` argument when the model has none."""
    best, best_key = None, None
    for parent_name, parent in model.named_modules():
        groups: dict[type, list[tuple[str, nn.Module]]] = {}
        for attr, child in parent.named_children():
            if next(child.children(), None) is not None and next(child.parameters(), None) is not None:
                groups.setdefault(type(child), []).append((attr, child))
        for members in groups.values():
            if len(members) < 2:
                continue
            params = {id(p): p.numel() for _, m in members for p in m.parameters()}
            key = (sum(params.values()), len(members), -parent_name.count(".") - bool(parent_name))
            if best_key is None or key > best_key:
                prefix = f"{parent_name}." if parent_name else ""
                best, best_key = [(parent, attr, prefix + attr) for attr, _ in members], key
    if best is None:
        raise ExatrainError(
            f"exatrain.parallelize: found no repeated blocks in {type(model).__name__} (no module "
            "has two or more "
            "children of the same class with layers of their own)",
            "pass blocks= explicitly: a list of submodules (blocks=list(model.layers)), the "
            "dotted name of their "
            "container (blocks='encoder.layers'), or blocks=[] to treat the whole model as one unit",
        )
    return Blocks(best)


def _submodule(model: nn.Module, name: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise ExatrainError(
            f"parallelize(blocks={name!r}): {type(model).__name__} has no submodule {name!r}",
            "pass the dotted name of the container of the blocks, as in model.named_modules() "
            "(e.g. blocks='model.layers')",
        ) from None
