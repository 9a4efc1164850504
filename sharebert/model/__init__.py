"""The model: shapes and presets (``shape``), the column plan (``plan``), weight generation (``eps``), attention,
the transformers config and models (``configuration_sharebert``, ``modeling_sharebert``), their registration with
transformers' Auto classes (``registration``), portable remote code (``portable``) and LoRA (``adapters``).
The bottom layer of the library: it imports nothing else of sharebert."""
