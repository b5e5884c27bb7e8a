"""What several runtimes share: the :class:`~surgery.runtimes.shared.runtime.Runtime` interface, the graph
exporters' common parts (target, inputs, parity), names, weight products, smoothing, the serving tokenizer.

The runtime folders (``surgery.runtimes.torch``, ``.onnx``, ``.openvino``) build on this package and never
on each other; the registry and the export verb sit above them all (``surgery.runtimes``).
"""
