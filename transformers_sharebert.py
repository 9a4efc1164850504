"""sharebert's registration with transformers and optimum; ``import sharebert`` imports it whenever torch and
transformers are installed, so user code needs no other import.

Importing it
* registers ``model_type="sharebert"`` with transformers' Auto classes (``sharebert.modeling_sharebert``);
* when optimum's ONNX exporter (optimum-onnx) is installed, registers our ``OnnxConfig``s with optimum's
  ``TasksManager`` (``sharebert.export.onnx_config``): ``main_export``, ``onnx_export_from_model``,
  ``ORTModelFor*.from_pretrained(folder, export=True)`` and ``optimum-cli export onnx`` take sharebert models.
  optimum-onnx decides which library a model object comes from by nothing but the module of its class
  (``TasksManager.infer_library_from_model``: a name starting with ``transformers`` means transformers, which
  is how it accepts remote-code models from ``transformers_modules``); a class defined in
  ``sharebert.modeling_sharebert`` is refused ("The library name could not be automatically inferred"),
  whatever ``library_name`` the caller gave. So on that path only, this module becomes the home
  (``__module__``) of the model classes; they stay the same objects, re-exported here, so pickling
  (optimum's validation subprocess) finds them under this name.
"""
from sharebert import _installed
from sharebert.modeling_sharebert import AUTO_CLASSES  # Auto classes registration

__all__ = [cls.__name__ for cls in AUTO_CLASSES.values()]

if _installed("optimum.exporters.onnx"):  # find_spec raises, not None, when the parent `optimum` is absent
    from sharebert.export import onnx_config  # noqa: F401  (TasksManager registration)

    for _cls in AUTO_CLASSES.values():
        _cls.__module__ = __name__
        globals()[_cls.__name__] = _cls
