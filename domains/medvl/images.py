"""Images of the medvl domain through MONAI: PNG / JPEG / BMP / TIFF (PIL), DICOM files and series folders
(pydicom) and NIfTI (nibabel), each read with ``monai.transforms.LoadImage`` into (channels, rows, columns)
float32 in [0, 1] at the model's size.

Orientation: rows run top to bottom and columns left to right as an image viewer shows a 2-D file (MONAI's readers
give (x, y), i.e. (column, row); this module puts rows first). DICOM: ``pixel_array``'s (rows, columns); a
multi-frame file or a series folder (slices stacked by MONAI in instance order) is a volume. NIfTI: the voxel
axes as stored, not reoriented: the first axis along the columns, the second along the rows (``data[:, :, k].T``).

A 3-D volume (a multi-frame DICOM, gray or RGB, included) gives its middle slice along its last spatial axis
(index ``depth // 2``); 4-D data (a NIfTI with a fourth axis: time, echoes, ...) is refused. Channels: RGB -> gray
by the ITU-R BT.601 luminance weights (0.299, 0.587, 0.114), gray -> RGB by repetition, RGBA drops alpha (PIL
palette and gray+alpha images are converted by PIL first); DICOM MONOCHROME1 is inverted so that bright means
high. Intensities are min-max scaled to [0, 1]
(``ScaleIntensity``: absolute units such as HU are not kept; a constant image becomes 0) and resized to
``size`` × ``size`` (``Resize``: area averaging when shrinking both sides, else bilinear; the aspect ratio is not
kept).

Refused, with a `UserError` that names the JSON file and record (``source``), the field and the path: a missing
file, a file the reader cannot read, a channel count other than 1, 3 or 4, a side below `MIN_IMAGE_PX`, more than
``max_pixels`` pixels (`MAX_IMAGE_PIXELS` by default; told by the file's header before its pixels are decoded: PIL's
``Image.open``, pydicom with the pixel data deferred, nibabel's header), a 1-D NIfTI, NaN or infinite values, and a
DICOM file with an element that declares more bytes than the file holds (checked as pydicom reads the header, before
it allocates). A PIL image above PIL's own refusal (178,956,970 pixels) stays refused even when ``max_pixels`` is
larger.

Shapes:
    `load_image` -> (channels, size, size) float32 in [0, 1]
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from pathlib import Path

import numpy as np
import torch

from workbench.core import dicom
from workbench.core.errors import UserError

#: The smallest side an input image may have [px].
MIN_IMAGE_PX = 32
#: The most pixels an input image (or volume, counting every slice) may have by default, rows × columns [× slices]
#: (the task's ``--max-image-pixels``). Below PIL's own decompression-bomb guard, which warns above
#: ``PIL.Image.MAX_IMAGE_PIXELS`` (89,478,485) and refuses above twice that (178,956,970): this limit speaks first.
MAX_IMAGE_PIXELS = 64_000_000
#: ITU-R BT.601 luminance weights of R, G, B.
LUMINANCE = (0.299, 0.587, 0.114)
PIL_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
DICOM_SUFFIXES = (".dcm", ".dicom", "")
NIFTI_SUFFIXES = (".nii", ".nii.gz")
_NAMES = {"pil": "an image (PIL)", "nifti": "NIfTI (nibabel)", "dicom": "DICOM (pydicom)"}


def _kind(path: Path) -> str:
    name = path.name.lower()
    if path.is_dir():
        return "dicom"
    if name.endswith(NIFTI_SUFFIXES):
        return "nifti"
    if path.suffix.lower() in PIL_SUFFIXES:
        return "pil"
    if path.suffix.lower() in DICOM_SUFFIXES:
        return "dicom"
    return "unknown"


def _pil_mode(image):
    """PIL images to a mode with 1, 3 or 4 channels (palette -> RGB(A), gray+alpha -> gray, CMYK etc. -> RGB)."""
    if image.mode in ("P", "PA"):
        return image.convert("RGBA" if "transparency" in image.info or image.mode == "PA" else "RGB")
    if image.mode in ("LA", "La", "1"):
        return image.convert("L")
    if image.mode in ("CMYK", "YCbCr", "LAB", "HSV"):
        return image.convert("RGB")
    return image


@functools.lru_cache(maxsize=None)
def _loader(kind: str):
    """``LoadImage`` with the reader of ``kind`` (made once: building one logs MONAI's note on the optional GPU
    DICOM codec, silenced here)."""
    from monai.data import NibabelReader, PILReader, PydicomReader
    from monai.transforms import LoadImage

    if kind == "pil":
        reader = PILReader(converter=_pil_mode, reverse_indexing=False)
    elif kind == "nifti":
        reader = NibabelReader()
    else:
        reader = PydicomReader(swap_ij=False)
    codec_log = logging.getLogger("monai.data.nvimgcodec_pydicom_plugin")
    level = codec_log.level
    codec_log.setLevel(logging.ERROR)
    try:
        return LoadImage(image_only=True, ensure_channel_first=True, reader=reader)
    finally:
        codec_log.setLevel(level)


class _Overrun(Exception):
    """A DICOM element declares more bytes than its file has left."""


class _BoundedFile:
    """A DICOM file for pydicom that refuses to read or skip past its end: an element whose declared length runs past
    the file is refused before pydicom allocates it (reads of at most `CHUNK` bytes, pydicom's own chunked reads,
    may ask past the end and get what is left)."""

    CHUNK = 1 << 16  # [bytes]

    def __init__(self, path: Path):
        self.name, self.size = str(path), path.stat().st_size
        self._file = open(path, "rb")

    def _refuse(self, wanted: int) -> _Overrun:
        at = self._file.tell()
        return _Overrun(f"an element at byte {at:,} declares {wanted:,} bytes, but {self.size - at:,} remain")

    def read(self, size: int = -1) -> bytes:
        if size is not None and size > max(self.size - self._file.tell(), self.CHUNK):
            raise self._refuse(size)
        return self._file.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset + (0, self._file.tell(), self.size)[whence]
        if target > self.size:
            raise self._refuse(target - self._file.tell())
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def __enter__(self) -> "_BoundedFile":
        return self

    def __exit__(self, *_) -> None:
        self._file.close()


def _check_readable(path: Path, kind: str, where: str, max_pixels: int):
    """Open the file's header with its library before MONAI reads the pixels (a short, precise message; an image
    over ``max_pixels`` is refused before it is decoded); the DICOM header or None."""
    from PIL import Image

    try:
        if kind == "pil":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit decides, below
                with Image.open(path) as image:
                    pixels, shape = image.width * image.height, f"{image.height} × {image.width}"
                    if pixels <= max_pixels:
                        image.verify()
            header = None
        elif kind == "nifti":
            import nibabel

            shape_ = nibabel.load(path).shape
            pixels, shape, header = math.prod(map(int, shape_)), " × ".join(map(str, shape_)), None  # no int64 wrap
        else:
            files = [path] if path.is_file() else [p for p in sorted(path.iterdir()) if p.is_file()]
            if not files:
                raise UserError(f"{where}: the DICOM folder {path} holds no file")
            for file in reversed(files):  # every file's element lengths checked; the first one's header kept
                with _BoundedFile(file) as bounded:  # a deflated dataset: inflated within a budget (workbench.core)
                    header = dicom.read_header(file, max_pixels, source=bounded)
            slices = int(getattr(header, "NumberOfFrames", 1) or 1) if path.is_file() else len(files)
            rows, cols = int(getattr(header, "Rows", 0) or 0), int(getattr(header, "Columns", 0) or 0)
            samples = int(getattr(header, "SamplesPerPixel", 1) or 1)
            if samples not in (1, 3, 4):
                raise UserError(f"{where}: {path} has {samples} samples per pixel; expected 1, 3 or 4")
            pixels, shape = rows * cols * slices, f"{rows} × {cols}" + (f" × {slices}" if slices > 1 else "")
    except dicom.DicomRefused as error:
        if error.shape is not None:  # the header's own size: said as for every other kind of image
            rows, cols, frames = error.shape
            shape = f"{rows} × {cols}" + (f" × {frames}" if frames > 1 else "")
            raise UserError(f"{where}: {path} is {shape} px ({rows * cols * frames:,} pixels); expected at most "
                            f"{max_pixels:,} (--max-image-pixels)") from None  # fmt: skip
        if error.too_large:
            raise UserError(f"{where}: {path}: {error.problem} (--max-image-pixels)") from None
        raise UserError(f"{where}: cannot read {path} as {_NAMES[kind]} ({error.problem})") from None
    except UserError:
        raise
    except _Overrun as error:
        raise UserError(f"{where}: {path} is not a readable DICOM file: {error}") from None
    except Image.DecompressionBombError as error:  # PIL's own refusal, above 2 × PIL.Image.MAX_IMAGE_PIXELS
        limit = f"expected at most {max_pixels:,} pixels (--max-image-pixels)"
        raise UserError(f"{where}: {path}: {error}; {limit}") from None
    except Exception as error:
        raise UserError(f"{where}: cannot read {path} as {_NAMES[kind]} ({type(error).__name__}: {error})") from None
    if pixels > max_pixels:
        raise UserError(
            f"{where}: {path} is {shape} px ({pixels:,} pixels); expected at most {max_pixels:,} (--max-image-pixels)"
        )
    return header


def _read(path: Path, kind: str, where: str, max_pixels: int) -> torch.Tensor:
    """The file as (channels, rows, columns[, depth]) float32 (see the module docstring's orientation)."""
    header = _check_readable(path, kind, where, max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MONAI's notes on missing DICOM orientation tags and the like
            image = _loader(kind)(str(path))
    except Exception as error:
        line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise UserError(f"{where}: cannot read {path} as {_NAMES[kind]} ({type(error).__name__}: {line})") from None
    data = image.as_tensor().to(torch.float32)
    has_channels = not np.isnan(float(image.meta.get("original_channel_dim", float("nan"))))
    spatial = data.ndim - 1
    if kind == "pil":
        return data
    if kind == "nifti":
        if has_channels or spatial > 3:
            raise UserError(f"{where}: {path} is 4-D (shape {list(data.shape)}); expected a 2-D image or a 3-D volume")
        if spatial < 2:
            raise UserError(f"{where}: {path} is 1-D (shape {list(data.shape)}); expected a 2-D image or a 3-D volume")
        return data.transpose(1, 2)
    photometric = str(getattr(header, "PhotometricInterpretation", "MONOCHROME2")).upper()
    if photometric.startswith("PALETTE"):
        raise UserError(f"{where}: {path} is a PALETTE COLOR DICOM; expected MONOCHROME1/2 or RGB pixel data")
    data = data[0]  # pydicom's layout: ([frames,] rows, columns[, samples])
    samples = int(getattr(header, "SamplesPerPixel", 1) or 1)
    if samples > 1:
        data = torch.movedim(data, -1, 0)
    else:
        data = data[None]
    if path.is_file() and int(getattr(header, "NumberOfFrames", 1) or 1) > 1:
        data = torch.movedim(data, 1, -1)  # frames last, as a series folder has them
    if photometric == "MONOCHROME1":
        data = data.max() - data
    if data.ndim > 4:
        raise UserError(f"{where}: {path} is 4-D (shape {list(data.shape)}); expected a 2-D image or a 3-D volume")
    return data


def _to_channels(data: torch.Tensor, channels: int, where: str, path) -> torch.Tensor:
    """(c, h, w) with c in {1, 3, 4} -> (channels, h, w) (see the module docstring)."""
    count = data.shape[0]
    if count not in (1, 3, 4):
        raise UserError(f"{where}: {path} has {count} channels; expected 1 (gray), 3 (RGB) or 4 (RGBA)")
    if count == 4:
        data = data[:3]
    if channels == 1 and data.shape[0] == 3:
        weights = torch.tensor(LUMINANCE, dtype=data.dtype).view(3, 1, 1)
        return (data * weights).sum(0, keepdim=True)
    if channels == 3 and data.shape[0] == 1:
        return data.repeat(3, 1, 1)
    return data


def load_image(
    path: str | Path,
    *,
    channels: int = 1,
    size: int = 64,
    field: str = "image",
    source: str | None = None,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> torch.Tensor:
    """One image as (channels, size, size) float32 in [0, 1] (the module docstring has every step).

    Args:
        path: a PNG / JPEG / BMP / TIFF, DICOM file or series folder, or NIfTI (``.nii``, ``.nii.gz``) file.
        channels: 1 (gray) or 3 (RGB) channels out.
        size: side of the square output [px].
        field: the JSON field the path came from (for messages).
        source: the JSON file and record the path came from (for messages), e.g. ``"train.json record 3 (q17)"``.
        max_pixels: the most pixels (rows × columns [× slices]) the file's header may declare; more is refused
            before decoding.
    """
    from monai.transforms import Resize, ScaleIntensity

    if channels not in (1, 3):
        raise UserError(f"channels must be 1 or 3, got {channels}")
    path = Path(path)
    where = f"{source}: field '{field}'" if source else f"field '{field}'"
    if not path.exists():
        raise UserError(f"{where}: image file {path} does not exist")
    kind = _kind(path)
    if kind == "unknown":
        suffixes = ", ".join(s for s in (*PIL_SUFFIXES, *DICOM_SUFFIXES, *NIFTI_SUFFIXES) if s)
        raise UserError(f"{where}: {path}: expected an image file ({suffixes}, a DICOM folder), found '{path.suffix}'")
    data = _read(path, kind, where, max_pixels)
    if 0 in data.shape:
        raise UserError(f"{where}: {path} has shape {list(data.shape)}; expected no empty axis")
    if data.ndim == 4:
        data = data[..., data.shape[-1] // 2]
    if data.ndim != 3:
        raise UserError(f"{where}: {path} has shape {list(data.shape)}; expected a 2-D image or a 3-D volume")
    rows, cols = data.shape[1:]
    if min(rows, cols) < MIN_IMAGE_PX:
        raise UserError(f"{where}: {path} is {rows} × {cols} px; expected at least {MIN_IMAGE_PX} px on each side")
    if not torch.isfinite(data).all():
        bad = int((~torch.isfinite(data)).sum())
        raise UserError(f"{where}: {path} has {bad} NaN or infinite values; expected finite intensities")
    data = _to_channels(data, channels, where, path)
    data = ScaleIntensity(minv=0.0, maxv=1.0)(data)
    mode = "area" if rows >= size and cols >= size else "bilinear"
    data = Resize((size, size), mode=mode, **({"align_corners": False} if mode == "bilinear" else {}))(data)
    data = data.as_tensor() if hasattr(data, "as_tensor") else torch.as_tensor(data)
    return data.to(torch.float32).clamp(0.0, 1.0).contiguous()
