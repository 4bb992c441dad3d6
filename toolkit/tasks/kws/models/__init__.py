"""Model registry. Importing this package registers every model type."""
from toolkit.tasks.kws.models.base import MODELS, ModelConfigBase, StreamingModel, build_model, count_parameters
from toolkit.tasks.kws.models import ds_tcn  # noqa: F401  (registers)
from toolkit.tasks.kws.models import tcn, mdtc, gru, bcresnet  # noqa: F401  (register)

__all__ = ["MODELS", "ModelConfigBase", "StreamingModel", "build_model", "count_parameters"]
