"""Each measured figure has one home: docs/performance.md, the face of benchmarks/results/. Another doc
links to its section instead of restating the figure, and no comment or docstring under */src carries
one (a figure in code ages while the code does not).

A figure is a number with a unit of measure: "123.3 dB", "1.5 s", "0.3-0.7 s", "436 MB", "1.49x". Two
kinds of number with a unit are not measurements, and may stand anywhere:

- a target or a bound, written with its comparator: "≤ 1.5 s", "> 100 dB";
- a fact of the code, the contract or the model (a frame's 80 ms, a default, a size), or a target
  written without its comparator, listed in NOT_MEASURED with where it comes from.

A ratio or a share counts only with a decimal point ("1.49x", "9.4 %"): "4x pointwise" or "2x the
quiet median" are a design and a target far more often than a measurement.
"""

from __future__ import annotations

import ast
import collections
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [*sorted(ROOT.glob("docs/*.md")), ROOT / "README.md"]
#: Generated from the .proto files: their comments are the contract's.
GENERATED = ROOT / "protocol" / "src" / "codecstream" / "v1"

_NUMBER = r"\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?"
_UNIT = r"dB|ms|µs|s|min|h|KB|kB|MB|GB|KiB|MiB|GiB|B/s|KB/s|MB/s|GB/s|TB/s|GFLOP/s"
FIGURE = re.compile(
    rf"(?<![\w.\-–/])(?P<comparator>(?:[≤≥<>]|at most|at least)\s?)?"
    rf"(?P<value>(?:{_NUMBER})(?:\s?[-–]\s?(?:{_NUMBER}))?)\s?(?P<unit>{_UNIT}|x|%)(?![\w/])"
)

#: Numbers with a unit that are not measurements: facts the code, the contract, the model or a
#: dependency fixes (a default, a limit, a size), and targets written without their comparator.
NOT_MEASURED = {
    "80 ms": "one codec frame at 12.5 frames/s (codecstream.protocol.decoding.FRAME_SECONDS)",
    "0 s": "the start of a stream's audio (codecstream.protocol.text_timing)",
    "20 ms": "the audio block a player pulls (codecstream.client.audio_out.BLOCK_FRAMES)",
    "400 B/s": "16 int16 codes per 80 ms frame (the contract)",
    "48,000 B/s": "24 kHz 16-bit PCM, what the codes replace",
    "5.3 MB": "the real-size decoder's streaming state (38 tensors, from the model's shapes)",
    "457 MB": "the real-size decoder's fp32 weights (114.3 M parameters)",
    "1 MiB": "a decoder download's part (codecstream.server.decoder_artifacts)",
    "8 MiB": "the largest reference audio a server takes (ServerLimits.max_reference_audio_bytes)",
    "8 MB": "the refused requests the benchmarks send, just over the 8 MiB limit",
    "8.5 MB": "the largest Start a voice-cloning server parses (ServerLimits.max_request_bytes)",
    "80 KB": "the largest Start a server that clones no voice parses (ServerLimits.max_request_bytes)",
    "1-30 s": "the reference audio's range (ServerLimits, as vLLM-Omni's speech API)",
    "2 GiB": "the largest protobuf, hence the largest ONNX file (codecstream.client.decoder_download)",
    "5.8 MB": "30 s of 48 kHz stereo 16-bit WAV",
    "164 s": "2048 frames, the talker's own max_new_tokens",
    "1.000 s": "how an error message rounds a duration (codecstream.server.reference_audio)",
    "16 KB": "the trailing metadata a gRPC Python client accepts",
    "64 KB": "the trailing metadata at which grpc-js stalls",
    "64 KiB": "HTTP/2's default receive window",
    "80 GB": "an H100's memory",
    # Defaults of the server's and the client's settings (ServerLimits, the CLI flags, the client's
    # keyword arguments), stated in the docs that explain them.
    "0.1 s": "the event-loop watchdog's timer (codecstream.server.loop_stalls)",
    "0.5 s": "the balancer's health interval (codecstream-balancer --health-interval)",
    "1 s": "a default (the jitter buffer's playout cap, the supervisor's first backoff)",
    "2 s": "a default (the client's reconnect bound, the balancer's drain delay)",
    "3 s": "Pipecat's own stop-frame timeout, which the plugin overrides",
    "5 s": "the shortest keepalive interval the server accepts from a client",
    "10 s": "a default (first-message timeout, keepalive timeout, shutdown grace)",
    "20 s": "a default (keepalive interval, engine wait, message budget refill)",
    "30 s": "a default (resume window, stalled-client timeout, the longest reference)",
    "50 ms": "a default (the resume backoff's first step, the event-loop lag bound)",
    "60 s": "a default (streamed text's silence, a download's stall)",
    "600 s": "a default (a streamed text's life, the decoder download's deadline)",
    "40 dB": "the parity floor of `codecstream parity`",
    "60 dB": "the parity target of a reduced-precision artifact",
}


def figures(text: str) -> list[str]:
    """The measured figures a text states, as written ("123.3 dB")."""
    found = []
    for match in FIGURE.finditer(text):
        if match["comparator"] or (match["unit"] in ("x", "%") and "." not in match["value"]):
            continue
        figure = f"{match['value']} {match['unit']}".replace("–", "-")
        if figure not in NOT_MEASURED:
            found.append(figure)
    return found


def comments(path: pathlib.Path) -> list[tuple[int, str]]:
    """A module's comments and docstrings, each with the line it starts on."""
    source = path.read_text()
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    return found


def sources() -> list[pathlib.Path]:
    return sorted(path for path in ROOT.glob("*/src/**/*.py") if GENERATED not in path.parents)


def test_the_figure_pattern_reads_measurements_and_leaves_targets_and_facts():
    text = "123.3 dB at C = 2; 0.3-0.7 s; 1,541 MB; 1.49x its floor; ≤ 1.5 s; > 100 dB; a frame (80 ms); 4x MLP"
    assert figures(text) == ["123.3 dB", "0.3-0.7 s", "1,541 MB", "1.49 x"]


def test_no_measured_figure_stands_in_two_docs():
    docs_of = collections.defaultdict(set)
    for doc in DOCS:
        for figure in figures(doc.read_text()):
            docs_of[figure].add(str(doc.relative_to(ROOT)))
    twice = {figure: sorted(docs) for figure, docs in sorted(docs_of.items()) if len(docs) > 1}
    assert not twice, (
        "measured figures stated in more than one doc (keep each in docs/performance.md and link to its "
        f"section): {twice}"
    )


def part(path: pathlib.Path) -> str:
    """The part of the tree a source belongs to: its distribution's folder."""
    return path.relative_to(ROOT).parts[0]


@pytest.mark.parametrize("name", sorted({part(path) for path in sources()}))
def test_no_code_comment_carries_a_measured_figure(name):
    found = [
        f"{path.relative_to(ROOT)}:{line}: {figure}"
        for path in sources()
        if part(path) == name
        for line, text in comments(path)
        for figure in figures(text)
    ]
    assert not found, f"measured figures in comments (state the fact, link docs/performance.md): {found}"


def slug(heading: str) -> str:
    """A Markdown heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_to_a_section_of_the_performance_page_finds_it():
    page = (ROOT / "docs" / "performance.md").read_text()
    headings = re.findall(r"^#+ (.+)$", page, flags=re.MULTILINE)
    anchors, titles = {slug(heading) for heading in headings}, set(headings)
    texts = {str(doc.relative_to(ROOT)): doc.read_text() for doc in DOCS}
    texts |= {str(path.relative_to(ROOT)): path.read_text() for path in sources()}
    broken = [
        f"{name}: {link}"
        for name, text in texts.items()
        for link in re.findall(r"performance\.md#([\w-]+)", text)
        if link not in anchors
    ]
    quote = re.compile(r'performance\.md,\s+(?:#:\s+)?"([^"]+)"')
    quoted = {
        name: {" ".join(title.replace("#:", " ").split()) for title in quote.findall(text)}
        for name, text in texts.items()
    }
    broken += [
        f"{name}: {title}"
        for name, found in quoted.items()
        for title in sorted(found)
        if not any(heading.startswith(title) for heading in titles)
    ]
    assert not broken, f"links to sections docs/performance.md does not have: {broken}"
