"""sharebert_runtime: run exported artifacts with ONNX Runtime, numpy and tokenizers only (no torch).

The bottom layer of sharebert, and the whole of a device install (``pip install sharebert``, no extras):
importing it never imports torch, transformers or the ``sharebert`` library package, on any install.
``Runtime(artifact_dir, threads=None, providers=None, ram="fp32"|"int8")`` verifies the artifact and
answers its task; ``sharebert predict`` and ``sharebert serve`` are built on it (``sharebert_runtime.main``
is the ``sharebert`` command).
"""

import importlib

__version__ = "0.1.0"  # the distribution's version (pyproject reads it here); sharebert.__version__ is this

# Loaded on first use, so that the ``sharebert`` command's overview and the library's ``import sharebert``
# (which reads ``__version__`` here) do not import onnxruntime.
_LAZY = {
    "ArtifactError": "artifact",
    "quantize_per_channel": "artifact",
    "verify_artifact": "artifact",
    "Predictions": "runtime",
    "Runtime": "runtime",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'sharebert_runtime' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
