"""How much one request to the served model may ask for, told from headers before anything is decoded.

A request body above ``max_request_bytes`` is refused by its ``Content-Length`` before it is read. Each uploaded
file's own header then tells the record's extent, checked before the model's reader decodes it:

- a signal record header (``.hea``: the record line's sample count and rate) and EDF/BDF (``.edf``, ``.bdf``: data
  records × their duration): duration [s] at most ``max_record_seconds``;
- PNG (the IHDR chunk's width × height), other PIL images (``.jpg``, ``.jpeg``, ``.bmp``, ``.tif``, ``.tiff``:
  PIL's lazy ``Image.open``, which reads the header only) and DICOM (``.dcm``, ``.dicom``: rows × columns × frames,
  pydicom with the pixel data not read): pixels at most ``max_pixels``.

A header these checks cannot parse is left to the model's reader, which refuses it with its own message.
"""

from __future__ import annotations

import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PIL_SUFFIXES = (".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server.

    Args:
        max_request_bytes: request body [bytes] (``--max-request-mb`` × 2^20).
        max_record_seconds: duration of one uploaded signal record [s].
        max_pixels: pixels of one uploaded image (rows × columns × frames).
        timeout_s: wall time from the request's start to its answer [s]; after it the client gets 504.
        max_files: files in one upload.
    """

    max_request_bytes: int = 64 << 20
    max_record_seconds: float = 24 * 3600.0
    max_pixels: int = 50_000_000
    timeout_s: float = 60.0
    max_files: int = 16


def too_large(path: Path, limits: Limits) -> str | None:
    """Why the uploaded file ``path`` asks for more than ``limits`` allow (one line naming it), None when it does
    not or its header cannot tell."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".hea":
            seconds = _signal_header_seconds(path)
        elif suffix in (".edf", ".bdf"):
            seconds = _edf_seconds(path)
        else:
            seconds = None
        pixels = _pixels(path, suffix)
    except (OSError, ValueError, struct.error):
        return None
    if seconds is not None and seconds > limits.max_record_seconds:
        return (f"{path.name}: a record of {seconds:.0f} s, above this server's limit of "
                f"{limits.max_record_seconds:.0f} s (--max-record-s); split the record")  # fmt: skip
    if pixels is not None and pixels > limits.max_pixels:
        return (f"{path.name}: an image of {pixels:,} pixels, above this server's limit of {limits.max_pixels:,} "
                "(--max-pixels); downsample it")  # fmt: skip
    return None


def _signal_header_seconds(path: Path) -> float | None:
    """Duration [s] on a signal header's record line (``name n_signals rate[/counter(base)] n_samples ...``)."""
    with path.open("rb") as handle:
        for raw in handle:
            line = raw.decode("ascii", "replace").split("#", 1)[0].split()
            if not line:
                continue
            if "/" in line[0] or len(line) < 4:  # a multi-segment record, or no sample count: the reader decides
                return None
            rate = float(line[2].split("/")[0].split("(")[0])
            return int(line[3]) / rate if rate > 0 else None
    return None


def _edf_seconds(path: Path) -> float | None:
    """Duration [s] in an EDF/BDF header: number of data records (bytes 236-244) × their duration (244-252)."""
    with path.open("rb") as handle:
        header = handle.read(256)
    if len(header) < 256:
        return None
    records, duration = int(header[236:244].decode("ascii").strip()), float(header[244:252].decode("ascii").strip())
    return records * duration if records > 0 and duration > 0 else None


def _pixels(path: Path, suffix: str) -> int | None:
    """Pixels an image file's header declares (None: not an image this module knows)."""
    if suffix == ".png":
        with path.open("rb") as handle:
            head = handle.read(24)
        if len(head) < 24 or head[:8] != _PNG_SIGNATURE or head[12:16] != b"IHDR":
            return None
        width, height = struct.unpack(">II", head[16:24])
        return width * height
    if suffix in _PIL_SUFFIXES:
        from PIL import Image

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            try:
                with Image.open(path) as image:
                    return image.width * image.height * getattr(image, "n_frames", 1)
            except Image.DecompressionBombError as error:  # PIL refuses past twice its limit, naming the size
                found = re.search(r"\((\d+) pixels\)", str(error))
                return int(found.group(1)) if found else 2 * Image.MAX_IMAGE_PIXELS + 1  # else: at least that
            except Image.UnidentifiedImageError:
                return None
    if suffix in (".dcm", ".dicom"):
        try:
            import pydicom
        except ImportError:
            return None
        try:
            data = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=["Rows", "Columns", "NumberOfFrames"])
        except Exception:  # pydicom raises many kinds for a malformed file: the reader reports it
            return None
        rows, columns = data.get("Rows"), data.get("Columns")
        if rows is None or columns is None:
            return None
        return int(rows) * int(columns) * int(data.get("NumberOfFrames") or 1)
    return None
