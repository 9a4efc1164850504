"""Pipelines that combine the layers: ``sharebert compress`` (``compress``: pick, distil, export, report) and its
classifier path (``compress_classifier``)."""
