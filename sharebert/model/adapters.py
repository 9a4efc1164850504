"""LoRA for sharebert models with peft: ``sharebert.lora_config(model)`` is the one call.

BERT's usual LoRA targets (``query``, ``value`` ``nn.Linear``s) do not exist here: every encoder matrix is
generated from one source tensor (``sharebert/model/eps.py``), so the adapter goes on that source, as a peft
``target_parameters`` entry (peft's LoRA on an ``nn.Parameter``, which reaches every read of it):

* ``sharing='veps'``: the virtual projection ``P`` (F x V) of ``weight_generator.projection``; the generated
  weights are columns of ``A (P + B_lora A_lora) + p``, so each moves by a rank-``r`` update ``A ΔP``;
* ``sharing='eps'``: the word embeddings ``A`` (E x F) themselves (``word_embeddings.weight``), the source of
  the generated weights, the token embeddings and the tied MLM decoder alike.

``sharing='none'`` has learned per-layer matrices in a ``ParameterDict``, which peft's parameter LoRA does
not take; it is refused. The adapters train alone (peft freezes the rest; a ``task_type`` keeps the task
head trainable, as for BERT), and ``merge_and_unload()`` gives a plain sharebert model to save and export.
"""

from __future__ import annotations

# The LoRA target of each sharing mode: the one tensor the encoder's weights are generated from.
LORA_TARGETS = {"veps": ["weight_generator.projection"], "eps": ["word_embeddings.weight"]}


def lora_config(
    model_or_config, r: int = 8, lora_alpha: int = 16, lora_dropout: float = 0.0, task_type: str | None = None, **kwargs
):
    """A ``peft.LoraConfig`` adapting the generated encoder weights of a sharebert model (or config).

    ``task_type`` as peft's (``"SEQ_CLS"``, ``"TOKEN_CLS"``, ...; it keeps the task head trainable);
    ``kwargs`` go to ``LoraConfig`` (e.g. ``modules_to_save``). Use it as
    ``peft.get_peft_model(model, sharebert.lora_config(model, task_type="SEQ_CLS"))``.
    """
    from peft import LoraConfig

    config = getattr(model_or_config, "config", model_or_config)
    if getattr(config, "model_type", None) != "sharebert":
        raise ValueError(f"lora_config is for sharebert models; got model_type {getattr(config, 'model_type', None)!r}")
    if config.sharing not in LORA_TARGETS:
        raise ValueError(
            f"lora_config: sharing={config.sharing!r} has no generated weights to adapt (its per-layer "
            f"matrices are not nn.Linear modules peft could target); LoRA needs sharing 'veps' or 'eps'"
        )
    return LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        task_type=task_type,
        target_modules=[],
        target_parameters=list(LORA_TARGETS[config.sharing]),
        **kwargs,
    )
