"""Export sharebert (and transformers BERT) models to verified ONNX artifacts (``sharebert export``).

Light on import: the heavy modules (torch, optimum, onnx) load when ``export_model`` is called.
"""

from __future__ import annotations


def export_model(*args, **kwargs) -> dict:
    """See :func:`sharebert.export.exporter.export_model`."""
    from .exporter import export_model as _export_model

    return _export_model(*args, **kwargs)


def session_options(artifact_dir):
    """See :func:`sharebert.export.exporter.session_options`."""
    from .exporter import session_options as _session_options

    return _session_options(artifact_dir)


__all__ = ["export_model", "session_options"]
