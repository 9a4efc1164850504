"""ONNX Runtime's transformer fusions on a sharebert graph (``sharebert export --optimize``).

``fuse(path, config)`` runs ``onnxruntime.transformers.optimizer.optimize_model`` (``model_type="bert"``,
the fusions only: ``opt_level=0``, so nothing is constant-folded into the file and the generated weights
stay graph nodes that ONNX Runtime folds at session creation) on ``path`` in place: LayerNormalization,
SkipLayerNormalization, (Bias)Gelu and, where the pattern matches, Attention. The depth gating survives as it
does any caller's own ``optimize_model`` call on an artifact: ``depth.wrap_layers`` builds the gated graph so
that the optimizer's graph-wide passes keep every ``If`` and find no pattern that spans a branch boundary
(docs/EXPORT.md, "ONNX Runtime's transformer optimizer").
"""

from __future__ import annotations

from pathlib import Path


def fuse(path: str | Path, config) -> dict[str, int]:
    """Apply ONNX Runtime's BERT fusions to the fp32 graph at ``path`` (rewritten in place) of a model with
    ``config`` (heads and hidden size); returns the fused operators' counts (those above 0)."""
    import onnx
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_shape_inference = False  # symbolic shapes do not follow values into If branches
    optimized = optimize_model(
        str(path),
        model_type="bert",
        num_heads=int(config.num_attention_heads),
        hidden_size=int(config.hidden_size),
        opt_level=0,
        use_gpu=False,
        optimization_options=options,
    )
    onnx.save(optimized.model, str(path))
    return {op: int(n) for op, n in optimized.get_fused_operator_statistics().items() if n}
