"""decoder="auto" against a server that lies: what it sends is data, never a path, a size to trust or
code to run. A deliberately malicious server (tests/malicious_server.py: real gRPC on a loopback
socket) offers manifests and bytes of its choosing; the client refuses each trick with a precise
error, writes nothing outside its cache folder, never unpickles what it received, and stops writing
at the size it agreed to."""

from __future__ import annotations

import io
import json
import pathlib
import pickle
import zipfile

import grpc
import pytest
from codecstream.client import Client
from codecstream.client.errors import CodecStreamError, ResumeFailed
from codecstream.client.runtimes import DecoderLoadError

from tests.malicious_server import manifest_json


def open_auto(target: str, backend: str = "auto"):
    with Client(target) as client:
        return client.open_decoder("auto", backend=backend)


def files_under(folder: pathlib.Path) -> set[pathlib.Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


@pytest.mark.parametrize(
    "file",
    ["../../escaped.onnx", "{outside}/escaped.onnx", "sub/escaped.onnx", "..", "", "dir\\escaped.onnx", "a\0b"],
)
def test_a_manifest_file_name_that_is_not_a_plain_name_is_refused_and_nothing_is_written(
    malicious_server, cache, tmp_path, file
):
    outside = tmp_path / "outside"
    outside.mkdir()
    data = b"bytes the server wants written somewhere"
    server = malicious_server([manifest_json("onnx", file.format(outside=outside), data)], data)
    with pytest.raises(DecoderLoadError, match=r"artifacts\.onnx\.file must be a plain file name"):
        open_auto(server.target)
    assert server.service.downloads == 0
    assert files_under(tmp_path) == set()  # nothing in the cache, nothing beside it


def test_a_server_that_offers_only_a_pt2_gets_nothing_unpickled(malicious_server, cache, tmp_path):
    pytest.importorskip("torch")
    marker = tmp_path / "the payload ran"
    payload = pickled_payload_pt2(marker)
    server = malicious_server([manifest_json("pt2", "decoder.pt2", payload)], payload)
    for backend in ("auto", "pt2"):
        with pytest.raises(DecoderLoadError, match=r"offers only pt2 decoder artifacts.* can run code"):
            open_auto(server.target, backend)
    assert not marker.exists()
    assert server.service.downloads == 0


def test_a_server_that_sends_more_than_its_manifest_lists_is_cut_off_at_that_size(malicious_server, cache):
    listed = b"x" * 42
    server = malicious_server([manifest_json("onnx", "decoder.onnx", listed)], listed + b"y" * (3 << 20))
    with pytest.raises(DecoderLoadError, match=r"sent more than the 42 bytes its manifest lists"):
        open_auto(server.target)
    assert all(path.stat().st_size <= 42 for path in files_under(cache))


def test_an_artifact_gone_between_listing_and_download_is_a_server_error_not_a_lost_stream(malicious_server, cache):
    # Issue 39: every NOT_FOUND became StreamNotFound ("start a new stream"), a resume error, here too.
    data = b"x" * 10
    server = malicious_server([manifest_json("onnx", "decoder.onnx", data)], data)
    server.service.download_status = (grpc.StatusCode.NOT_FOUND, "no decoder artifact with that sha256")
    with pytest.raises(CodecStreamError, match="NOT_FOUND: no decoder artifact with that sha256") as raised:
        open_auto(server.target)
    assert not isinstance(raised.value, ResumeFailed)
    assert "decoder.onnx" not in {path.name for path in files_under(cache)}


def test_an_artifact_larger_than_a_client_takes_is_refused_before_any_byte(malicious_server, cache):
    data = b"x" * 10
    server = malicious_server([manifest_json("onnx", "decoder.onnx", data, size=1 << 40)], data)
    refusal = r"size_bytes 1099511627776 for its onnx decoder, which is over the 2147483648 bytes"
    with pytest.raises(DecoderLoadError, match=refusal):
        open_auto(server.target)
    assert server.service.downloads == 0


class _TouchesAFile:
    """What a hostile pickle does when it is loaded; here, only create `marker`."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def pickled_payload_pt2(marker: pathlib.Path) -> bytes:
    """A real torch.export archive of a Linear whose first weight is marked as pickled and holds a
    pickle that creates `marker` when torch.export.load reads it."""
    import torch

    exported = io.BytesIO()
    torch.export.save(torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),)), exported)
    source = zipfile.ZipFile(io.BytesIO(exported.getvalue()))
    config_name = next(name for name in source.namelist() if name.endswith("/weights/model_weights_config.json"))
    config = json.loads(source.read(config_name))
    first = next(iter(config["config"].values()))
    first["use_pickle"] = True
    payload_name = config_name.rsplit("/", 1)[0] + "/" + first["path_name"]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == config_name:
                data = json.dumps(config).encode()
            elif info.filename == payload_name:
                data = pickle.dumps(_TouchesAFile(marker), protocol=2)
            archive.writestr(info, data)
    return out.getvalue()
