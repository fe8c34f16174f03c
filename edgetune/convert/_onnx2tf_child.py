"""The converter's own process: run with the converter environment's Python (onnx2tf, TensorFlow),
never imported by edgetune (it imports nothing of edgetune; numpy 1.x lives there).

``python _onnx2tf_child.py SPEC.json`` with SPEC one of

* ``{"op": "convert", "onnx": static.onnx, "out": dir, "probe_seed": int}``: onnx2tf to a SavedModel
  (``dir/saved_model``) and ``dir/fp32.tflite``, ``dir/fp16.tflite`` (weights float16, computed in
  float32 where the runtime has no float16 kernels: onnx2tf's own float16 recipe);
* ``{"op": "quantize", "saved_model": dir, "precision": "int8-dynamic" | "int8-full", "out": file,
  "calibration": npz, "sets": n}``: TensorFlow Lite's converter on that SavedModel: dynamic-range
  int8 weights, or full int8 (weights and activations) calibrated on ``n`` sets of the npz (arrays
  ``s<i>__<signature input name>`` already in the SavedModel's layout), float32 at the inputs and outputs.

Everything the libraries print goes to this process's stdout/stderr, which the host sends to a log
file. A failure prints ``edgetune-convert-failed: <one line>`` last on stderr and exits 3.
"""

import json
import os
import shutil
import sys

FAILED_MARK = "edgetune-convert-failed:"


def _probe_images(seed):
    """onnx2tf validates its graph on sample images it downloads (MS-COCO, 20x128x128x3) when an input
    looks like one: seeded values of ours instead (no network; the same every run)."""
    import numpy as np

    rng = np.random.default_rng([seed, 20])
    return rng.random((20, 128, 128, 3), dtype=np.float32)


def convert(spec):
    import onnx2tf
    import onnx2tf.onnx2tf as o2t_main
    import onnx2tf.utils.common_functions as o2t_common

    images = _probe_images(int(spec.get("probe_seed", 0)))
    o2t_main.download_test_image_data = lambda: images.copy()
    o2t_common.download_test_image_data = lambda: images.copy()
    out = spec["out"]
    sm = os.path.join(out, "saved_model")
    onnx2tf.convert(input_onnx_file_path=spec["onnx"], output_folder_path=sm, output_signaturedefs=True,
                    non_verbose=True, verbosity="error")
    made = {"fp32": "model_float32.tflite", "fp16": "model_float16.tflite"}
    stem = os.path.splitext(os.path.basename(spec["onnx"]))[0]
    for prec in made:
        src = os.path.join(sm, "%s_%s.tflite" % (stem, "float32" if prec == "fp32" else "float16"))
        if not os.path.isfile(src):
            raise RuntimeError("onnx2tf wrote no %s model" % prec)
        shutil.move(src, os.path.join(out, prec + ".tflite"))
    if not os.path.isfile(os.path.join(sm, "saved_model.pb")):
        raise RuntimeError("onnx2tf wrote no SavedModel")


def quantize(spec):
    import numpy as np
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(spec["saved_model"])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if spec["precision"] == "int8-full":
        z = np.load(spec["calibration"], allow_pickle=False)
        n = int(spec["sets"])
        names = sorted({k.split("__", 1)[1] for k in z.files})

        def representative():
            for i in range(n):
                yield {name: z["s%d__%s" % (i, name)] for name in names}

        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.float32
        converter.inference_output_type = tf.float32
    elif spec["precision"] != "int8-dynamic":
        raise ValueError("unknown precision %r" % spec["precision"])
    data = converter.convert()
    with open(spec["out"], "wb") as f:
        f.write(data)


def main(argv):
    with open(argv[1]) as f:
        spec = json.load(f)
    try:
        (convert if spec["op"] == "convert" else quantize)(spec)
    except SystemExit as exc:  # onnx2tf ends with sys.exit(1) after printing what went wrong
        print("%s onnx2tf stopped (exit %s)" % (FAILED_MARK, exc.code), file=sys.stderr)
        return 3
    except BaseException as exc:  # the converter's own error: this conversion's failure
        import traceback

        traceback.print_exc()
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print("%s %s: %s" % (FAILED_MARK, type(exc).__name__, first[:300]), file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
