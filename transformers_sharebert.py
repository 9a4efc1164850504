"""sharebert for optimum's own entry points: ``import transformers_sharebert`` once, then
``main_export``, ``onnx_export_from_model`` and ``ORTModelFor*.from_pretrained(folder, export=True)`` take
sharebert models (``optimum-cli export onnx`` imports this module at start, see docs/EXPORT.md "optimum").

Importing it
* registers ``model_type="sharebert"`` with transformers' Auto classes (``sharebert.modeling_sharebert``)
  and our ``OnnxConfig``s with optimum's ``TasksManager`` (``sharebert.export.onnx_config``);
* makes this module the home (``__module__``) of the model classes. optimum-onnx 0.1.0 decides which
  library a model object comes from by nothing but the module of its class
  (``TasksManager.infer_library_from_model``: a name starting with ``transformers`` means transformers,
  which is how it accepts remote-code models from ``transformers_modules``); a class defined in
  ``sharebert.modeling_sharebert`` is refused ("The library name could not be automatically inferred"),
  whatever ``library_name`` the caller gave. The classes stay the same objects, re-exported here, so
  pickling (optimum's validation subprocess) finds them under this name.

Kept out of ``import sharebert``, which loads neither torch nor transformers.
"""
from sharebert.export import onnx_config  # noqa: F401  (TasksManager registration)
from sharebert.modeling_sharebert import AUTO_CLASSES  # Auto classes registration

for _cls in AUTO_CLASSES.values():
    _cls.__module__ = __name__
    globals()[_cls.__name__] = _cls

__all__ = [cls.__name__ for cls in AUTO_CLASSES.values()]
