"""Decoder artifacts a server offers for download, so that a client needs only the server's address.

The operator exports the decoder of the served checkpoint once (`codecstream export-decoder`) and
passes the directories with `--decoder-artifact`. At start every manifest is read, its codec
checked against the codes the server sends (a decoder for other weights would decode noise) and
every file's sha256 verified, so a wrong or damaged artifact stops the server with one line
instead of failing on clients. Files are served by sha256, from any offset, in parts
(DownloadDecoderArtifact): a client resumes a broken download where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterator, Sequence

from codecstream.protocol.codec_spec import spec_differences
from codecstream.protocol.errors import ManifestError
from codecstream.protocol.manifest import MANIFEST_FILE, SHA256, read_manifest, verified_artifact_path
from codecstream.v1 import codec_pb2
from codecstream.v1 import synthesis_pb2 as pb

#: Bytes per DownloadDecoderArtifactResponse. The stall rule counts parts a client takes, so a part
#: is small: a client taking fewer than PART_BYTES per stalled_client_timeout_s (2.2 kB/s at the
#: defaults) is dropped, a slower link than any a decoder download is worth; with 1 MiB parts a
#: client under 35 kB/s was.
PART_BYTES = 1 << 16
#: Bytes read from the file per trip to a thread, cut into parts there.
READ_BYTES = 1 << 20


class ArtifactNotOffered(LookupError):
    """A download names a file this server does not offer."""


class OffsetOutOfRange(ValueError):
    """A download asks for bytes past the end of the file."""


@dataclasses.dataclass(frozen=True)
class OfferedFile:
    path: pathlib.Path
    size_bytes: int


class DecoderArtifacts:
    """The artifact directories a server offers: their manifests, and their files by sha256."""

    def __init__(self, manifests_json: Sequence[str] = (), files: dict[str, OfferedFile] | None = None) -> None:
        #: manifest.json of each directory, as ListDecoderArtifacts sends it.
        self.manifests_json = tuple(manifests_json)
        self._files = dict(files or {})

    @classmethod
    def load(cls, directories: Sequence[pathlib.Path], codec: codec_pb2.CodecSpec) -> DecoderArtifacts:
        """Read and verify `directories`; ValueError (one line) for a directory that is not a valid
        artifact for `codec`. Hashes every file: about a second for the real-size decoder."""
        manifests, files = [], {}
        for directory in directories:
            try:
                manifest = read_manifest(directory)
                differences = spec_differences(codec, manifest.codec_spec())
                if differences:
                    raise ValueError(
                        f"decoder artifact {directory} does not decode this server's codes ({'; '.join(differences)}): "
                        "export it from the served checkpoint"
                    )
                for entry in manifest.artifacts.values():
                    path = verified_artifact_path(directory, entry)
                    files[entry.sha256] = OfferedFile(path, path.stat().st_size)
                manifests.append(json.dumps(manifest.to_json()))
            except ManifestError as error:
                raise ValueError(f"decoder artifact: {error}") from None
            except OSError as error:
                raise ValueError(f"decoder artifact {directory / MANIFEST_FILE}: {error.strerror or error}") from None
        return cls(manifests, files)

    def __len__(self) -> int:
        return len(self.manifests_json)

    def open(self, sha256: str, offset: int) -> OfferedFile:
        """The file named by `sha256`, checked for a download from `offset`."""
        if not SHA256.fullmatch(sha256):
            raise ValueError(
                "sha256 must be 'sha256:' and 64 lowercase hex digits, as a manifest lists it "
                f"({len(sha256)} characters given)"
            )
        offered = self._files.get(sha256)
        if offered is None:
            raise ArtifactNotOffered(f"this server offers no decoder artifact file with {sha256}")
        if offset > offered.size_bytes:
            raise OffsetOutOfRange(f"offset {offset} is past the end of the {offered.size_bytes}-byte file")
        return offered


def serialized_parts(offered: OfferedFile, offset: int) -> Iterator[list[tuple[int, bytes]]]:
    """The parts of `offered` from `offset` to its end, READ_BYTES of the file at a time: each a
    list of (bytes of the file, serialized DownloadDecoderArtifactResponse) of PART_BYTES each
    (blocking reads and copies: run it in a thread)."""
    with open(offered.path, "rb") as handle:
        handle.seek(offset)
        while offset < offered.size_bytes:
            data = handle.read(min(READ_BYTES, offered.size_bytes - offset))
            if not data:
                return
            parts = []
            for start in range(0, len(data), PART_BYTES):
                piece = data[start : start + PART_BYTES]
                parts.append(
                    (len(piece), pb.DownloadDecoderArtifactResponse(offset=offset, data=piece).SerializeToString())
                )
                offset += len(piece)
            yield parts
