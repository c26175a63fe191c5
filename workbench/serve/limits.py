"""How much one request to the served model may ask for, told from headers before anything is decoded.

The request body is counted as it arrives (`workbench.serve.app`): past ``max_request_bytes`` it is cut with 413,
whatever ``Content-Length`` or ``Transfer-Encoding`` said. Each uploaded file's own header then tells the record's
extent, checked (`check_upload`, in a worker process of `workbench.serve.decoding`, inside its memory, CPU and wall
limits) before the model's reader decodes it; suffixes are compared in lower case:

- a signal record header (``.hea``: the record line's sample count and rate) and EDF/BDF (``.edf``, ``.bdf``: data
  records × their duration): duration [s] at most ``max_record_seconds``. A header whose duration cannot be told is
  refused (422), not left to the reader: a multi-segment record, a rate or sample count that is missing, not a
  number or not positive, an EDF whose number of data records is not positive (-1, unknown: told from the file's
  size and the signals' samples per record);
- PNG (the IHDR chunk's width × height), other PIL images (``.jpg``, ``.jpeg``, ``.bmp``, ``.tif``, ``.tiff``:
  PIL's lazy ``Image.open``, which reads the header only), NIfTI (``.nii``, ``.nii.gz``: the header's dimensions,
  its first 348 bytes inflated at most) and DICOM (``.dcm``, ``.dicom`` and files without a suffix, which image
  readers take as DICOM: `workbench.core.dicom.read_header`, rows × columns × frames, a deflated dataset inflated
  in chunks against the budget its header allows): pixels at most ``max_pixels``;
- a JSON file (``.json``: the questions file of a task that answers questions about uploaded images): at most
  ``max_json_bytes`` bytes, told by its size before it is parsed, and, when it is a list, at most ``max_questions``
  records (each record asks one or more questions the model answers).

An image header these checks cannot parse is left to the model's reader, which refuses it with its own message.
"""

from __future__ import annotations

import gzip
import math
import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PIL_SUFFIXES = (".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
_DICOM_SUFFIXES = (".dcm", ".dicom", "")
LIMIT = "this server's limit"


class Unbounded(ValueError):
    """A header whose extent cannot be told: the upload is refused (422) with this one-line message."""


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server.

    Args:
        max_request_bytes: request body [bytes] (``--max-request-mb`` × 2^20), counted as received.
        max_record_seconds: duration of one uploaded signal record [s].
        max_pixels: pixels of one uploaded image (rows × columns × frames).
        timeout_s: wall time from the request's start to its answer [s]; after it the client gets 504.
        max_files: files in one upload.
        check_workers: worker processes checking uploads' headers (`workbench.serve.decoding`).
        check_memory_mb: address space a checking worker may add to what it holds when it starts [MiB].
        check_seconds: wall time [s] (and CPU time, rounded up) one file's check may take; past it the worker is
            killed and replaced and the request gets 413.
        max_json_bytes: size of one uploaded JSON file (a questions file) [bytes] (``--max-json-mb`` × 2^20).
        max_questions: records of one uploaded JSON list (a questions file's questions; ``--max-questions``).
    """

    max_request_bytes: int = 64 << 20
    max_record_seconds: float = 24 * 3600.0
    max_pixels: int = 50_000_000
    timeout_s: float = 60.0
    max_files: int = 16
    check_workers: int = 2
    check_memory_mb: int = 512
    check_seconds: float = 10.0
    max_json_bytes: int = 1 << 20
    max_questions: int = 256


def check_upload(path: Path, limits: Limits) -> tuple[int, str] | None:
    """Why the uploaded file ``path`` may not be decoded: ``(413, message)`` when its header asks for more than
    ``limits`` allow, ``(422, message)`` when its extent cannot be told; None when it may (or is not a kind this
    module knows). Messages are one line naming the file."""
    from workbench.core.dicom import DicomRefused, read_header

    name = path.name.lower()
    suffix = ".nii.gz" if name.endswith(".nii.gz") else path.suffix.lower()
    if suffix == ".json":
        return _check_json(path, limits)
    try:
        if suffix == ".hea":
            seconds = _signal_header_seconds(path)
        elif suffix in (".edf", ".bdf"):
            seconds = _edf_seconds(path)
        else:
            seconds = None
        if suffix in _DICOM_SUFFIXES:
            read_header(path, limits.max_pixels)  # refuses past the pixels and the inflation budget
            pixels = None
        else:
            pixels = _pixels(path, suffix)
    except Unbounded as error:
        return 422, f"{path.name}: {error}"
    except DicomRefused as error:
        if error.too_large and error.problem.startswith("an image of"):
            return 413, f"{path.name}: {error.problem.replace('the limit', LIMIT)} (--max-pixels); downsample it"
        if error.too_large:
            return 413, f"{path.name}: {error.problem}"
        return None  # not DICOM after all, or malformed: the reader says what is wrong
    except (OSError, ValueError, struct.error, EOFError):
        return None
    if seconds is not None and seconds > limits.max_record_seconds:
        return 413, (f"{path.name}: a record of {seconds:.0f} s, above this server's limit of "
                     f"{limits.max_record_seconds:.0f} s (--max-record-s); split the record")  # fmt: skip
    if pixels is not None and pixels > limits.max_pixels:
        return 413, (f"{path.name}: an image of {pixels:,} pixels, above this server's limit of {limits.max_pixels:,} "
                     "(--max-pixels); downsample it")  # fmt: skip
    return None


def too_large(path: Path, limits: Limits) -> str | None:
    """`check_upload`'s message, None when the file may be decoded."""
    found = check_upload(path, limits)
    return None if found is None else found[1]


def _check_json(path: Path, limits: Limits) -> tuple[int, str] | None:
    """413 for a JSON file above ``max_json_bytes`` (its size, before parsing) or a list of more than
    ``max_questions`` records; a file that is not JSON is left to the reader."""
    import json

    size = path.stat().st_size
    if size > limits.max_json_bytes:
        return 413, (f"{path.name}: a JSON file of {size:,} bytes, above {LIMIT} of {limits.max_json_bytes:,} "
                     "(--max-json-mb); send fewer questions per request")  # fmt: skip
    try:
        records = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return None
    if isinstance(records, list) and len(records) > limits.max_questions:
        return 413, (f"{path.name}: {len(records):,} records, above {LIMIT} of {limits.max_questions:,} questions "
                     "per request (--max-questions); split the questions file")  # fmt: skip
    return None


def _number(text: str, field: str, zero: bool = False) -> float:
    """``text`` as a positive (or, with ``zero``, non-negative) finite number, else `Unbounded` naming ``field``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value > 0 or (zero and value == 0))):
        raise Unbounded(f"{field} is {text!r}: expected a {'non-negative' if zero else 'positive'} number")
    return value


def _signal_header_seconds(path: Path) -> float:
    """Duration [s] on a signal header's record line (``name n_signals rate[/counter(base)] n_samples ...``)."""
    with path.open("rb") as handle:
        for raw in handle:
            line = raw.decode("ascii", "replace").split("#", 1)[0].split()
            if not line:
                continue
            if "/" in line[0]:
                raise Unbounded("a multi-segment record (record line 'name/segments'): this server cannot bound its "
                                "duration from the header; send a single-segment record")  # fmt: skip
            if len(line) < 4:
                raise Unbounded(f"record line {' '.join(line)!r}: expected 'name n_signals rate n_samples' (the "
                                "sampling rate [Hz] and the number of samples)")  # fmt: skip
            rate = _number(re.split(r"[/(]", line[2])[0], "record line field 3 (sampling rate [Hz])")
            samples = _number(line[3], "record line field 4 (number of samples)")
            return samples / rate
    raise Unbounded("no record line: expected 'name n_signals rate n_samples'")


def _edf_seconds(path: Path) -> float:
    """Duration [s] in an EDF/BDF header: number of data records (bytes 236-244) × their duration (244-252); an
    unknown number (-1, a recording still being written) is the data's size over one record's (the signals' samples
    per record, 2 bytes each in EDF, 3 in BDF)."""
    with path.open("rb") as handle:
        header = handle.read(256)
        records = header[236:244].decode("ascii", "replace").strip()
        if len(header) < 256:
            raise Unbounded(f"{len(header)} bytes: shorter than an EDF header (256 bytes)")
        seconds = _number(header[244:252].decode("ascii", "replace").strip(),
                          "EDF header field 'duration of a data record' (bytes 244-251)", zero=True)  # fmt: skip
        if records != "-1":
            return _number(records, "EDF header field 'number of data records' (bytes 236-243)") * seconds
        signals = int(_number(header[252:256].decode("ascii", "replace").strip(),
                              "EDF header field 'number of signals' (bytes 252-255)"))  # fmt: skip
        handle.seek(256 + signals * 216)
        fields = handle.read(8 * signals)
    if len(fields) < 8 * signals:
        raise Unbounded(f"{signals} signals, but the file ends inside its signal headers")
    field = "EDF signal {}'s number of samples per data record"
    samples = sum(_number(fields[8 * k : 8 * k + 8].decode("ascii", "replace").strip(), field.format(k + 1))
                  for k in range(signals))  # fmt: skip
    record_bytes = samples * (3 if header[:1] == b"\xff" else 2)
    return max(0, path.stat().st_size - 256 * (1 + signals)) / max(record_bytes, 1) * seconds


def _nifti_pixels(path: Path, suffix: str) -> int | None:
    """Voxels a NIfTI-1/2 header declares (its dimensions); a gzipped file inflated only as far as its header."""
    opener = gzip.open if suffix == ".nii.gz" else open
    with opener(path, "rb") as handle:
        head = handle.read(540)
    for order in "<>":
        if len(head) >= 348 and struct.unpack(order + "i", head[:4])[0] == 348:
            dims = struct.unpack(order + "8h", head[40:56])
        elif len(head) >= 540 and struct.unpack(order + "i", head[:4])[0] == 540:
            dims = struct.unpack(order + "8q", head[16:80])
        else:
            continue
        if not 1 <= dims[0] <= 7:
            return None
        return math.prod(max(1, int(d)) for d in dims[1 : dims[0] + 1])
    return None


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
    if suffix in (".nii", ".nii.gz"):
        return _nifti_pixels(path, suffix)
    return None
