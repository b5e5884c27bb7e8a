"""Persistence and safety: saving and reloading a changed model, atomically, from untrusted files.

* :mod:`.model_io`: ``save_pretrained`` / ``from_pretrained`` (weights, config, the ``surgery.json`` manifest);
* :mod:`.atomic`: writes that land whole or not at all, and never over what a user owns;
* :mod:`.untrusted`: checks of files read from disk (safetensors headers, no custom code);
* :mod:`.task_heads`: which task head a checkpoint holds (the safetensors header only).
"""
