"""Converter stages between a Workload and a Builder (docs/design.md §3b): a model converted for
another runtime family, content-addressed, keyed by the converter's version, and verified against
the original's float64 reference through an explicit mapping of its inputs and outputs.

``onnx2tflite``: ONNX -> .tflite (LiteRT / XNNPACK) with onnx2tf, in an environment of its own.
"""
