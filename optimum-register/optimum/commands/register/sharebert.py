"""sharebert's hook into optimum-cli: optimum-cli imports every module of its ``optimum.commands.register``
namespace at start (``optimum.commands.optimum_cli.load_optimum_namespace_cli_commands``). For
``optimum-cli export ...`` and ``optimum-cli onnxruntime ...`` it imports ``transformers_sharebert``, which
registers model_type ``"sharebert"`` with transformers and optimum: ``export onnx --model FOLDER --task TASK
OUT`` exports sharebert folders, and ``onnxruntime quantize`` copies an artifact's ``config.json`` beside the
quantized graph. Other commands (``env``, ``--help``) skip that import (torch and transformers: seconds).
It adds no command. Before ``export onnx`` runs, ``sharebert.export.optimum_cli.preflight`` makes the checks
``sharebert export`` makes for a sharebert folder (a missing or damaged folder, an artifact, an unknown task,
a file as output, a task without trained head): one line and exit 2 instead of a traceback."""

import sys

if sys.argv[1:2] in (["export"], ["onnxruntime"]):
    import transformers_sharebert  # noqa: F401

    if sys.argv[2:3] == ["onnx"]:
        from sharebert.export.optimum_cli import preflight

        preflight(sys.argv[3:])

REGISTER_COMMANDS = []
