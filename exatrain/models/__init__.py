"""The reference Transformer LM. `sizes` is torch-free; import `transformer` for the model itself."""

from exatrain.models.sizes import SIZES, ModelShape, configured_shape, model_shape

__all__ = ["SIZES", "ModelShape", "configured_shape", "model_shape"]
