"""The blocks exatrain.parallelize shards one by one in the examples, found on the real packages' models
(torchvision's ResNet-18, transformers' LlamaForCausalLM, the course's nn.TransformerEncoder) as they
build them: the READMEs promise layer1..layer4 and one unit per decoder layer."""

import torch
import torchvision
from transformers import LlamaConfig, LlamaForCausalLM

from exatrain.distributed.blocks import find_blocks
from tests.examples.helpers import EXAMPLES, load_module


def test_resnet18_blocks_are_its_four_stages():
    assert find_blocks(torchvision.models.resnet18(num_classes=3)).keys() == [
        "layer1",
        "layer2",
        "layer3",
        "layer4",
    ]


def test_llama_blocks_are_its_decoder_layers():
    config = LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4
    )
    blocks = find_blocks(LlamaForCausalLM(config))
    assert blocks.keys() == ["model.layers.0", "model.layers.1", "model.layers.2"]


def test_course_lm_blocks_are_its_encoder_layers():
    single = load_module(EXAMPLES / "course_lm" / "single.py", "course_single_blocks")
    model = single.TransformerLM(50, 32, 4, 2, 16, 0.0)
    assert find_blocks(model).keys() == ["encoder.layers.0", "encoder.layers.1"]
    assert isinstance(model(torch.zeros(2, 16, dtype=torch.long)), torch.Tensor)
