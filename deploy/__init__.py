"""sharebert.deploy: run exported artifacts with ONNX Runtime, numpy and tokenizers only (no torch).

``Runtime(artifact_dir, threads=None, providers=None, ram="fp32"|"int8")`` verifies the artifact and
answers its task; ``sharebert predict`` and ``sharebert serve`` are built on it.
"""
from .artifact import ArtifactError, quantize_per_channel, verify_artifact
from .runtime import Predictions, Runtime

__all__ = ["ArtifactError", "Predictions", "Runtime", "quantize_per_channel", "verify_artifact"]
