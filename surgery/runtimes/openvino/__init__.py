"""The OpenVINO runtimes (``openvino``, ``openvino-bf16``, ``openvino-int8``): the IR exporter and its served model
(:mod:`surgery.runtimes.openvino.openvino_ir`), the export verb (:mod:`surgery.runtimes.openvino.openvino_export`),
NNCF int8 and its quantization-aware refit, the IR bench row and the Runtime classes. Needs the ``openvino`` extra
(``pip install 'encoder-surgery[openvino]'``)."""
