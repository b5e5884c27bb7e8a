"""File names, choices and defaults of the ONNX export, importable without torch (the CLI builds its help from them).

Example:
    >>> ONNX_NAME, TASKS[0]
    ('model.onnx', 'auto')
"""

ONNX_NAME = "model.onnx"
INFO_NAME = "surgery-onnx.json"
#: ``--task`` values: ``auto`` exports the head the model was saved with.
TASKS: tuple[str, ...] = ("auto", "base", "seq-cls", "mlm")
#: SmoothQuant's migration strength for ``--calibration`` (surgery.runtimes.shared.smooth), chosen on MiniLM
#: embeddings and fine-tuned MiniLM classifiers (experiments/int8/probe_int8_smoothing.py).
SMOOTH_ALPHA = 0.85
#: How many texts calibrate the activation ranges by default (``--calibration-texts``).
CALIBRATION_TEXTS = 512
#: What the default exported graph looks like, for caches of its timings (surgery.compress's latency
#: tables): raised whenever a change of the exporter changes the speed of the graphs it writes
#: (2: each layer's attention fused into one MultiHeadAttention operator).
GRAPH_FORMAT = 2
#: The packages of the ``onnx`` extra, by import name.
ONNX_PACKAGES: tuple[str, ...] = ("onnx", "onnxruntime", "onnxscript")
