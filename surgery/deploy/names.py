"""File names and choices of the ONNX export, importable without torch (the CLI builds its help from them).

Example:
    >>> ONNX_NAME, TASKS[0]
    ('model.onnx', 'auto')
"""

ONNX_NAME = "model.onnx"
INFO_NAME = "surgery-onnx.json"
#: ``--task`` values: ``auto`` exports the head the model was saved with.
TASKS: tuple[str, ...] = ("auto", "base", "seq-cls", "mlm")
