import pytest

from viceroy.runtime.wire import BadMessage, Signer, new_key


def test_a_signed_message_round_trips():
    s = Signer(new_key())
    frames = s.pack({"op": "run", "id": 3}, [b"code"], [b"\0" * 100])
    header, signed, data = s.unpack(frames)
    assert header["op"] == "run" and signed == [b"code"] and bytes(data[0]) == b"\0" * 100


def test_a_header_with_a_lone_surrogate_round_trips():
    # A file name os.listdir gives for non-UTF-8 bytes ('caf\udce9.txt') as a result, an
    # argument or in an error message: the receiver's JSON parser refused it and the message
    # was dropped as bad, so the call it answered never ended.
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    s = Signer(new_key())
    header, _, _ = s.unpack(s.pack({"op": "result", "v": name, "summary": f"ValueError: {name}"}))
    assert header["v"] == name and header["summary"] == f"ValueError: {name}" and s.dropped == 0


@pytest.mark.parametrize(
    "tamper",
    [
        lambda f: [b"\0" * 32 + f[0][32:], *f[1:]],  # forged signature
        lambda f: [f[0][32:], *f[1:]],  # unsigned
        lambda f: [f[0].replace(b'"id":3', b'"id":4'), *f[1:]],  # header changed
        lambda f: [f[0], b"evil code", *f[2:]],  # signed payload changed
        lambda f: [*f[:2], b"short"],  # data frame length changed
        lambda f: [f[0][:32] + b"not json", *f[1:]],
        lambda f: [b"tiny"],
    ],
)
def test_tampered_messages_are_dropped_and_counted(tamper):
    s = Signer(new_key())
    frames = s.pack({"op": "run", "id": 3}, [b"code"], [b"data" * 10])
    with pytest.raises(BadMessage):
        s.unpack(tamper(frames))
    assert s.dropped == 1


def test_another_meshs_key_does_not_verify():
    frames = Signer(new_key()).pack({"op": "run"})
    other = Signer(new_key())
    with pytest.raises(BadMessage):
        other.unpack(frames)
