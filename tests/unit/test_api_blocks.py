"""Block auto-detection of exatrain.parallelize on the shapes of real model families (plain nn.Modules with
the same structure: a Hugging Face decoder, a torchvision ResNet), explicit blocks, and no blocks at all."""

import pytest
from torch import nn

from exatrain.distributed.blocks import detect_blocks, find_blocks
from exatrain.errors import ExatrainError


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (
            nn.Linear(d, 4 * d),
            nn.Linear(d, 4 * d),
            nn.Linear(4 * d, d),
        )


class DecoderLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.self_attn, self.mlp = Attention(d), MLP(d)
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(d), nn.LayerNorm(d)


class LlamaLike(nn.Module):
    """LlamaForCausalLM's module tree: model.embed_tokens, model.layers[i], model.norm, lm_head."""

    def __init__(self, d=16, n=3, vocab=100):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, d)
        self.model.layers = nn.ModuleList(DecoderLayer(d) for _ in range(n))
        self.model.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout)


class ResNetLike(nn.Module):
    """torchvision's ResNet-18 tree: conv1, bn1, layer1..layer4 (Sequential of BasicBlocks), fc."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.relu = nn.Conv2d(3, 8, 7), nn.BatchNorm2d(8), nn.ReLU()
        widths = [8, 8, 16, 32, 64]
        for i in range(4):
            setattr(
                self,
                f"layer{i + 1}",
                nn.Sequential(BasicBlock(widths[i], widths[i + 1]), BasicBlock(widths[i + 1], widths[i + 1])),
            )
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(64, 10)


def test_hugging_face_decoder_layers_are_the_blocks():
    model = LlamaLike()
    blocks = detect_blocks(model)
    assert blocks.keys() == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert all(isinstance(b, DecoderLayer) for b in blocks.values())


def test_resnet_stages_are_the_blocks():
    blocks = detect_blocks(ResNetLike())
    assert blocks.keys() == ["layer1", "layer2", "layer3", "layer4"]


def test_replacing_a_block_replaces_it_in_the_model():
    model = LlamaLike()
    blocks = detect_blocks(model)
    wrapped = nn.Sequential(blocks["model.layers.1"])
    blocks["model.layers.1"] = wrapped
    assert model.model.layers[1] is wrapped


def test_explicit_blocks_by_name_and_by_module():
    model = LlamaLike()
    assert find_blocks(model, "model.layers").keys() == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert find_blocks(model, [model.model.layers[2]]).keys() == ["model.layers.2"]
    assert len(find_blocks(model, [])) == 0


def test_no_repeated_blocks_names_the_blocks_argument():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))  # single layers are never blocks
    with pytest.raises(ExatrainError) as e:
        detect_blocks(model)
    assert "blocks=" in e.value.hint and "Sequential" in e.value.message


@pytest.mark.parametrize("bad", ["encoder.layers", [nn.Linear(2, 2)]])
def test_blocks_that_are_not_in_the_model(bad):
    with pytest.raises(ExatrainError, match="blocks="):
        find_blocks(LlamaLike(), bad)
