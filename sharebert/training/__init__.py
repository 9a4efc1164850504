"""Training: corpora and pre-training (``corpus``, ``pretrain``), GLUE fine-tuning and evaluations."""
