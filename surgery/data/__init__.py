"""Data that methods train and calibrate on.

* :mod:`.task_data`: labelled text files loaded, tokenized, split and batched (``TaskData``);
* :mod:`.assets`: short names for the embedded model and dataset (``minilm-l6``, ``rotten-tomatoes``).

What training data must look like is part of the method contract: :mod:`surgery.core.requirements`.
"""
