"""sharebert's registration with transformers and optimum; ``import sharebert`` imports it whenever torch and
transformers are installed, so user code needs no other import.

Importing it
* registers ``model_type="sharebert"`` with transformers' Auto classes (``sharebert.model.registration``);
* when optimum's ONNX exporter (optimum-onnx) is installed, registers our ``OnnxConfig``s with optimum's
  ``TasksManager`` (``sharebert.export.onnx_config``): ``main_export``, ``onnx_export_from_model``,
  ``ORTModelFor*.from_pretrained(folder, export=True)`` and ``optimum-cli export onnx`` take sharebert models.
  optimum-onnx decides which library a model object comes from by nothing but the module of its class
  (``TasksManager.infer_library_from_model``: a name starting with ``transformers`` means transformers, which
  is how it accepts remote-code models from ``transformers_modules``); a class defined in
  ``sharebert.model.modeling_sharebert`` is refused ("The library name could not be automatically inferred"),
  whatever ``library_name`` the caller gave. So this module is the home (``__module__``) of the model classes
  (transformers' ``save_pretrained`` after ``register_for_auto_class`` needs it too, below); they stay the same
  objects, re-exported here, so pickling (optimum's validation subprocess) finds them under this name.
"""

from sharebert import _installed
from sharebert.model import registration  # noqa: F401  (the Auto classes registration)
from sharebert.model.modeling_sharebert import AUTO_CLASSES

__all__ = [cls.__name__ for cls in AUTO_CLASSES.values()]

if _installed("optimum.exporters.onnx"):  # find_spec raises, not None, when the parent `optimum` is absent
    from sharebert.export import onnx_config  # noqa: F401  (TasksManager registration)

# Not on the optimum path only: transformers' own save_pretrained after register_for_auto_class copies the class's
# module file (custom_object_save) before sharebert.model.portable writes the generated one; from
# sharebert.model.modeling_sharebert it would copy a file portable then refuses to overwrite
# (tests/deploy/test_untrusted.py).
for _cls in AUTO_CLASSES.values():
    _cls.__module__ = __name__
    globals()[_cls.__name__] = _cls
