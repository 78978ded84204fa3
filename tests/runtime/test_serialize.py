import io
import pickle
import re

import numpy as np
import pytest

from viceroy.runtime import serialize


def test_large_numpy_arrays_travel_out_of_band():
    a = np.arange(1 << 20, dtype=np.float32)
    payload, bufs = serialize.dumps({"a": a})
    assert len(payload) < 4096  # the data is not in the pickle stream
    assert sum(b.raw().nbytes for b in bufs) == a.nbytes
    back = serialize.loads(payload, [b.raw().tobytes() for b in bufs])
    np.testing.assert_array_equal(back["a"], a)


def test_received_arrays_are_writable():
    a = np.ones(1 << 16)
    payload, bufs = serialize.dumps(a)
    back = serialize.loads(payload, [memoryview(b.raw().tobytes()) for b in bufs])  # read-only, as zmq gives
    back += 1
    assert back[0] == 2


def test_torch_cpu_tensors_travel_out_of_band_with_dtype_and_grad():
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        t = torch.arange(1 << 16).to(dtype)
        payload, bufs = serialize.dumps(t)
        assert len(payload) < 4096
        back = serialize.loads(payload, [b.raw() for b in bufs])
        assert back.dtype == dtype and torch.equal(back, t)
    g = torch.ones(3, requires_grad=True)
    assert serialize.loads(*serialize.dumps(g)).requires_grad


def test_closures_and_lambdas_travel_by_value():
    k = 7
    payload, bufs = serialize.dumps(lambda x: x * k)
    assert serialize.loads(payload, bufs)(6) == 42


def test_unpicklable_values_are_named():
    import threading

    with pytest.raises(TypeError, match=r"argument 1 \(lock\) cannot be sent"):
        serialize.check_picklable({"argument 0": 1, "argument 1": threading.Lock()})


def test_an_open_file_is_refused_naming_it_not_sent_as_its_contents(tmp_path):
    # cloudpickle sent it as a StringIO of everything it held, read to the end: another object.
    path = tmp_path / "data.txt"
    path.write_text("x" * 100)
    with open(path) as f, pytest.raises(pickle.PicklingError, match=rf"^an open file \('{re.escape(str(path))}'\) "
                                        "cannot be sent to another process: send its name, or what you read from it$"):
        serialize.dumps({"f": f})
    with open(path, "rb") as f, pytest.raises(pickle.PicklingError, match="an open file"):
        serialize.dumps([f])
    back = serialize.loads(*_round(io.BytesIO(b"abc")))  # in-memory streams are values
    assert back.getvalue() == b"abc"


def _round(value):
    payload, bufs = serialize.dumps(value)
    return payload, [b.raw().tobytes() for b in bufs]


def test_values_inlined_in_headers_come_back_with_their_type_and_value():
    from viceroy.runtime.serialize import json_scalar
    from viceroy.runtime.wire import Signer, new_key

    signer = Signer(new_key())
    edges = [2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 1e308, -0.0, float("inf"), float("nan"), "é"]
    inlined = [v for v in edges if json_scalar(v)]
    assert inlined == [2**63 - 1, -(2**63), 2**64 - 1, 1e308, -0.0, "é"]  # the rest travel pickled
    header, _, _ = signer.unpack(signer.pack({"vals": inlined}))
    assert header["vals"] == inlined and [type(v) for v in header["vals"]] == [type(v) for v in inlined]


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                   "float8_e5m2fnuz", "float8_e8m0fnu", "uint16"])
def test_tensors_of_dtypes_numpy_lacks_travel_exactly(dtype):
    import torch

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(getattr(torch, dtype))[:, 1:]  # not contiguous
    payload, bufs = serialize.dumps({"t": t, "scalar": t[0, 0]})
    back = serialize.loads(payload, [b.raw() for b in bufs])
    for got, want in ((back["t"], t), (back["scalar"], t[0, 0])):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))
