"""Accounting from the config alone: parameter, byte and FLOP counts (``counts``), the budget search (``budget``)
and the training-curve plots (``curves``). Torch-free."""
