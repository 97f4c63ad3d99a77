"""Sequence encoders and their building blocks; imports neither Lightning nor Hydra."""

from recsys.model.atrank import ATRank
from recsys.model.embeddings import BehaviorAwareEmbedding
from recsys.model.outputs import EncoderOutput

__all__ = ["ATRank", "BehaviorAwareEmbedding", "EncoderOutput"]
