"""sharebert's registration with transformers' Auto classes: ``model_type="sharebert"`` for ``AutoConfig`` and each
``AutoModel*`` of ``AUTO_CLASSES``, and the package classes' ``save_pretrained`` that writes portable code.

Importing this module registers (transformers' documented extension point, one call per class); the top-level
``transformers_sharebert``, which ``import sharebert`` imports where torch and transformers are installed, imports it.
It is kept out of ``configuration_sharebert`` and ``modeling_sharebert`` so that ``sharebert.model.portable`` copies
those modules whole: a portable folder's code (remote code, ``trust_remote_code=True``) is registered by
transformers from its ``auto_map`` and saved by transformers' own ``save_pretrained``.
"""

from __future__ import annotations

import os

import transformers
from transformers import AutoConfig, PreTrainedModel

from .configuration_sharebert import ShareBertConfig
from .modeling_sharebert import AUTO_CLASSES, ShareBertPreTrainedModel

AutoConfig.register(ShareBertConfig.model_type, ShareBertConfig, exist_ok=True)  # AutoConfig reads sharebert folders
for _auto, _cls in AUTO_CLASSES.items():
    getattr(transformers, _auto).register(ShareBertConfig, _cls, exist_ok=True)


def _save_pretrained(self, save_directory, *args, **kwargs):
    """transformers' save. After ``register_for_auto_class()`` (the model's or its config's), or for a model loaded from
    a portable folder (its config has an ``auto_map``: a fine-tuned copy must not point at code it lacks), the folder
    gets sharebert's portable modeling code and ``auto_map`` (``sharebert.model.portable``), loadable with
    ``trust_remote_code=True`` where sharebert is not installed, instead of transformers' copy of the module defining
    the class (which imports sharebert). Package only: a portable copy, itself remote code, is saved by transformers as
    it is. With ``push_to_hub=True`` the upload follows the portable files (``push_to_hub``, which saves through this
    method). A save without ``auto_map`` removes the portable files an earlier save left there (``remove_portable``)."""
    if self._auto_class is None and self.config._auto_class is None and not getattr(self.config, "auto_map", None):
        result = PreTrainedModel.save_pretrained(self, save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            from .portable import remove_portable

            remove_portable(save_directory)  # an earlier portable save's code, which this config no longer names
        return result
    from .portable import check_portable_target, make_portable

    check_portable_target(save_directory)  # before anything is written
    push = kwargs.pop("push_to_hub", False)
    hub = {k: kwargs.pop(k) for k in _HUB_OPTIONS if k in kwargs}
    # Shadow the class attributes for this one save, the config's too (``type(m.config).register_for_auto_class()``):
    # transformers would copy the modules defining the classes (which import sharebert) under the portable files' names.
    own = [(obj, obj.__dict__.get("_auto_class", _UNSET)) for obj in (self, self.config)]
    self._auto_class = self.config._auto_class = None
    try:
        result = PreTrainedModel.save_pretrained(self, save_directory, *args, **kwargs)
    finally:
        for obj, value in own:  # the class attribute shows through again (or the instance's own, as it was)
            if value is _UNSET:
                del obj._auto_class
            else:
                obj._auto_class = value
    if not kwargs.get("is_main_process", True):  # another process writes the folder (distributed training)
        return result
    make_portable(save_directory, AUTO_CLASSES)
    if push:  # transformers' own push would upload before the portable files exist; its save goes through this one
        self.push_to_hub(
            hub.pop("repo_id", os.path.basename(os.path.normpath(save_directory))),
            **hub,
            **{k: kwargs[k] for k in ("max_shard_size",) if k in kwargs},
        )
    return result


_UNSET = object()
_HUB_OPTIONS = ("repo_id", "commit_message", "commit_description", "private", "token", "create_pr", "revision", "tags")


ShareBertPreTrainedModel.save_pretrained = _save_pretrained
