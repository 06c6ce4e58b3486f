"""Why an export could not be made, in one line a user can act on."""

from __future__ import annotations

from codecstream.protocol.errors import CodecStreamError


class ExportError(CodecStreamError):
    """A bad checkpoint, an unsupported format/mode/dtype combination, a missing optional
    dependency (the message names the extra to install) or a failed conversion."""
