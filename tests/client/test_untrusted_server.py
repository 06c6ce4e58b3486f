"""decoder="auto" against a server that lies: what it sends is data, never a path, a size to trust or
code to run. A deliberately malicious server (tests/malicious_server.py: real gRPC on a loopback
socket) offers manifests and bytes of its choosing; the client refuses each trick with a precise
error, writes nothing outside its cache folder, never unpickles what it received, and stops writing
at the size it agreed to."""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import random
import subprocess
import sys
import time
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


# -- artifacts that do not load (issue 49) --------------------------------------------------------

#: A client process that opens the server's decoder on ExecuTorch and prints how that ended.
_OPEN_PTE = """
import sys
from codecstream.client import Client
from codecstream.client.runtimes import DecoderLoadError
try:
    with Client(sys.argv[1]) as client:
        client.open_decoder("auto", backend="pte")
except DecoderLoadError as error:
    print("DecoderLoadError:", error)
else:
    print("opened")
"""


def open_in_a_client_process(target: str, cache: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CODECSTREAM_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, "-c", _OPEN_PTE, target], env=env, capture_output=True, text=True, timeout=600
    )


def test_a_pte_of_random_bytes_kills_no_client_and_is_not_kept(malicious_server, cache):
    """On main ExecuTorch's loader logged the file's identifier, its Python binding could not
    decode the bytes, and the exception it threw through C++ aborted the client (SIGABRT, exit
    134); the file matched its manifest's sha256, so it stayed cached and every later open aborted
    again without a download."""
    pytest.importorskip("executorch.runtime")
    data = b"\x00\x00\x00\x00\xc3\x28\xa6\xb4" + random.Random(7).randbytes(4088)  # not UTF-8 where the id is
    server = malicious_server([manifest_json("pte", "decoder.pte", data)], data)
    for attempt in (1, 2):
        ended = open_in_a_client_process(server.target, cache)
        assert ended.returncode == 0, f"attempt {attempt}: exit {ended.returncode}: {ended.stderr[-2000:]}"
        assert ended.stdout.startswith("DecoderLoadError: the pte decoder the server at"), ended.stdout
        assert "is not an ExecuTorch program" in ended.stdout and "not kept" in ended.stdout
        assert "decoder.pte" not in {path.name for path in files_under(cache)}
    assert server.service.downloads == 2  # nothing cached to open again: the second call downloads


def test_a_file_that_does_not_load_on_its_runtime_is_refused_and_not_kept(malicious_server, cache):
    data = random.Random(3).randbytes(2048)
    server = malicious_server([manifest_json("onnx", "decoder.onnx", data)], data)
    with pytest.raises(DecoderLoadError, match=r"the onnx decoder the server at \S+ offers cannot be used, .*not kept"):
        open_auto(server.target)
    assert "decoder.onnx" not in {path.name for path in files_under(cache)}


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def manifest_with(data: bytes, **changes) -> str:
    manifest = json.loads(manifest_json("onnx", "decoder.onnx", data))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = manifest
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return json.dumps(manifest)


@pytest.mark.parametrize(
    ("manifest", "refusal"),
    [
        (lambda d: manifest_with(d, chunk_frames__max=float("inf")), r"chunk_frames\.max: expected a whole number"),
        (lambda d: manifest_with(d, chunk_frames__max=-5), r"chunk_frames must satisfy 1 <= min <= max <= 250"),
        (lambda d: manifest_with(d, chunk_frames__min=3, chunk_frames__max=2), r"got min 3 and max 2"),
        (lambda d: manifest_with(d, chunk_frames__max=True), r"chunk_frames\.max: expected a whole number"),
        (lambda d: manifest_with(d).replace('"mode": "stateful"', '"mode": ' + deep(50_000)), r"nested too deeply"),
        (
            lambda d: manifest_with(
                d, state=[{"name": "kv", "shape": [1 << 16, 1 << 16, 1 << 16], "dtype": "float32"}]
            ),
            r"state takes \d+ bytes, over the 67108864",
        ),
        (
            lambda d: manifest_with(d, state=[{"name": "kv", "shape": [1, "frames"], "dtype": "float32"}]),
            r"state\[0\]\.shape must be fixed",
        ),
        (
            lambda d: manifest_with(d, inputs=[{"name": "codes", "shape": [1, "x" * 5000], "dtype": "int64"}]),
            r"inputs\[0\]\.shape has 'xxx.*\.\.\., expected",
        ),
        (lambda d: manifest_with(d, inputs=[{"name": "c", "shape": [1], "dtype": "object"}]), r"inputs\[0\]\.dtype"),
        (lambda d: manifest_with(d, codec__num_codebooks="sixteen"), r"not a valid decoder manifest"),
        (lambda d: manifest_with(d, window={"context_frames": 72, "min_context_frames": 1e9}), r"window must"),
        (lambda d: manifest_with(d, artifacts__onnx__size_bytes=0), r"size_bytes must be .* at least 1, got 0"),
        (lambda d: "x" * (2 << 20), r"over the 1048576 a client parses"),
    ],
    ids=[
        "infinite chunk",
        "negative chunk",
        "min above max",
        "boolean chunk",
        "50,000 deep",
        "4 PiB state",
        "state of a varying shape",
        "long dimension name",
        "unknown dtype",
        "codec field of the wrong type",
        "float window",
        "empty file",
        "2 MiB manifest",
    ],
)
def test_manifest_numbers_a_client_would_allocate_or_loop_by_are_range_checked(
    malicious_server, cache, manifest, refusal
):
    """On main these raised OverflowError, RecursionError, numpy's MemoryError, FileNotFoundError
    (size 0) out of open_decoder, or (chunk_frames.max -5) opened and decoded 0 samples."""
    data = b"x" * 64
    server = malicious_server([manifest(data)], data)
    with pytest.raises(DecoderLoadError, match=refusal):
        open_auto(server.target)
    assert server.service.downloads == 0


def test_decoder_auto_gives_up_at_its_deadline_against_a_server_that_trickles(malicious_server, cache):
    """On main a server sending a byte every 2 s kept open_decoder("auto") downloading forever."""
    data = b"x" * 1024
    server = malicious_server([manifest_json("onnx", "decoder.onnx", data)], data)
    server.service.trickle = (1, 0.5)
    started = time.monotonic()
    with Client(server.target, decoder_timeout_s=2.0) as client:
        with pytest.raises(DecoderLoadError, match=r"was not ready within 2 s \(decoder_timeout_s\)"):
            client.open_decoder("auto")
    assert time.monotonic() - started < 30  # the deadline, not the 60 s part timeout nor the end of the file
