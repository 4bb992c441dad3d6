"""ONNX metadata read and rewritten at the protobuf wire level (toolkit.onnx_proto) agrees
with the onnx package and ONNX Runtime, keeps the graph byte for byte, refuses what is
not an ONNX model by name, and keeps the onnx package out of a process that only reads."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from toolkit.onnx_proto import OnnxProtoError, read_metadata_props, set_metadata_prop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def small_model(path, props):
    import onnx
    from onnx import helper, numpy_helper
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y],
                              initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="test")
    for key, value in props:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(path))
    return model


def test_read_agrees_with_onnx_and_a_rewrite_keeps_the_graph(tmp_path):
    import onnx
    import onnxruntime as ort
    path = tmp_path / "m.onnx"
    long_value = json.dumps({"units": ["a"] * 3000, "name": "ĥéý jarvis"})   # a 2-byte varint
    model = small_model(path, [("first", "1"), ("toolkit_metadata", long_value), ("last", "z")])
    assert read_metadata_props(str(path)) == {"first": "1", "toolkit_metadata": long_value,
                                              "last": "z"}
    path.chmod(0o640)
    set_metadata_prop(str(path), "toolkit_metadata", '{"threshold": 0.5}')   # replaced in place
    set_metadata_prop(str(path), "added", "ü" * 200)                         # appended
    again = onnx.load(str(path))
    onnx.checker.check_model(again)
    assert [(e.key, e.value) for e in again.metadata_props] == [
        ("first", "1"), ("toolkit_metadata", '{"threshold": 0.5}'), ("last", "z"),
        ("added", "ü" * 200)]
    assert again.graph.SerializeToString() == model.graph.SerializeToString()
    assert again.opset_import == model.opset_import and again.producer_name == "test"
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]                        # no temp left
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map["added"] == "ü" * 200
    out = session.run(None, {"x": np.ones((2, 3), np.float32)})[0]
    np.testing.assert_array_equal(out, np.arange(1, 7, dtype=np.float32).reshape(2, 3))


def test_duplicate_keys_read_as_onnx_runtime_reads_them_and_are_rewritten_once(tmp_path):
    import onnx
    path = tmp_path / "m.onnx"
    import onnxruntime as ort
    small_model(path, [("k", "old"), ("other", "o"), ("k", "newer")])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert read_metadata_props(str(path)) == session.get_modelmeta().custom_metadata_map
    assert read_metadata_props(str(path))["k"] == "newer"
    set_metadata_prop(str(path), "k", "v")
    assert [(e.key, e.value) for e in onnx.load(str(path)).metadata_props] == [
        ("k", "v"), ("other", "o")]


@pytest.mark.parametrize("content", [b"", b"not a model at all\n", b"\x0f\x00\x00",
                                     "truncated"])
def test_what_is_not_an_onnx_model_is_refused_by_name_and_left_alone(tmp_path, content):
    path = tmp_path / "bad.onnx"
    if content == "truncated":
        small_model(path, [("k", "v")])
        content = path.read_bytes()[:-7]
    path.write_bytes(content)
    with pytest.raises(OnnxProtoError, match="bad.onnx"):
        read_metadata_props(str(path))
    with pytest.raises(OnnxProtoError, match="bad.onnx"):
        set_metadata_prop(str(path), "k", "v")
    assert path.read_bytes() == content and os.listdir(tmp_path) == ["bad.onnx"]


def test_reading_and_updating_exported_metadata_does_not_import_onnx(tmp_path):
    path = tmp_path / "model.onnx"
    small_model(path, [("toolkit_metadata", '{"feature": {"frame_shift_ms": 10}}')])
    script = """
import sys
from toolkit.export import read_metadata, update_metadata
assert read_metadata(sys.argv[1] + "/model.onnx")["feature"]["frame_shift_ms"] == 10
assert update_metadata(sys.argv[1], {"threshold": 0.25}) == [sys.argv[1] + "/model.onnx"]
assert read_metadata(sys.argv[1] + "/model.onnx")["threshold"] == 0.25
print("onnx imported:", "onnx" in sys.modules, "torch imported:", "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "onnx imported: False torch imported: False" in out.stdout
