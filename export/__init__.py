"""Export sharebert (and transformers BERT) models to verified ONNX artifacts (``sharebert export``).

Light on import: the heavy modules (torch, optimum, onnx) load when ``export_model`` is called.
"""
from __future__ import annotations


def export_model(*args, **kwargs) -> dict:
    """See :func:`sharebert.export.exporter.export_model`."""
    from .exporter import export_model as _export_model

    return _export_model(*args, **kwargs)


__all__ = ["export_model"]
