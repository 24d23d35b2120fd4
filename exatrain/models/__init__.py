"""The reference Transformer LM. `sizes` is torch-free; import `transformer` for the model itself."""

from exatrain.models.sizes import SIZES, ModelShape, model_shape

__all__ = ["SIZES", "ModelShape", "model_shape"]
