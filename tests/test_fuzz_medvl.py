"""Fuzzed medvl readers (`tests/fuzzing.py`): every mutated input is read or refused with a `UserError` naming the
file, never a traceback, a hang or a memory blow-up.

Seeds are real files: the embedded LLaVA records (``domains/medvl/embedded/``), VQA-RAD's OSF JSON and MEVF's
``trainset.json`` (``tests/data/real/medvl/``), a SLAKE file in its published layout (written here: no SLAKE file is
vendored), and the images as read — the embedded PNG, a real VQA-RAD JPEG, pydicom's ``CT_small.dcm`` and nibabel's
``anatomical.nii``. Mutations: bytes (`fuzzing.mutated`); JSON that parses but holds wrong types, missing keys,
unicode (right-to-left marks, emoji, NUL, lone surrogates) and enormous or deeply nested values; image headers with
absurd sizes. ``FUZZ_EXAMPLES`` per reader here, ``DEEP_EXAMPLES`` with ``pytest -m slow -k fuzz``.
"""

from __future__ import annotations

import copy
import json
import shutil
import struct
import zlib
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("monai")
nibabel = pytest.importorskip("nibabel")
pydicom = pytest.importorskip("pydicom")

import torch  # noqa: E402
from fuzzing import check_read_or_refused, deep, fuzz, mutated  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pydicom.data import get_testdata_file  # noqa: E402
from workbench.domains.medvl.images import load_image  # noqa: E402
from workbench.domains.medvl.readers import VlSample, read_folder, read_json  # noqa: E402

from workbench.core.errors import UserError  # noqa: E402
from workbench.core.records import BadRecordError, SkipReport  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "domains" / "medvl" / "embedded"
REAL = Path(__file__).parent / "data" / "real" / "medvl"
VQA_RAD_JSON = REAL / "vqa_rad" / "VQA_RAD Dataset Public.json"
JPEG = REAL / "vqa_rad_mevf" / "images" / "synpic51426.jpg"
PNG = EMBEDDED / "images" / "s0001_ct.png"
DICOM = Path(get_testdata_file("CT_small.dcm"))
NIFTI = Path(nibabel.__file__).parent / "tests" / "data" / "anatomical.nii"
DEPTHS = [pytest.param(fuzz, id="fuzz"), pytest.param(deep, id="deep", marks=pytest.mark.slow)]
#: What each fuzzed reader did: (reader, profile) -> Counter(read=, refused=); printed at the end (pytest -s).
OUTCOMES: dict[tuple[str, str], Counter] = {}


@pytest.fixture(scope="module", autouse=True)
def print_outcomes():
    """Import MONAI's readers before the memory cap of the first read, and print the read/refused counts after."""
    for path in (PNG, JPEG, DICOM, NIFTI):
        load_image(path)
    yield
    for (reader, profile), counts in sorted(OUTCOMES.items()):
        print(f"\nfuzz medvl {reader:10} {profile:5} read {counts['read']:4}  refused {counts['refused']:4}")


def count(reader: str, profile, result) -> None:
    name = "deep" if profile is deep else "fuzz"
    OUTCOMES.setdefault((reader, name), Counter())["read" if result is not None else "refused"] += 1


# --- seeds ---------------------------------------------------------------------------------------------------------


def _llava_records() -> list[dict]:
    """One embedded record of each task (VQA closed and open, report, the three generation tasks)."""
    chosen: dict[str, dict] = {}
    for record in json.loads((EMBEDDED / "train.json").read_text()):
        chosen.setdefault(record["task"], record)
    return list(chosen.values())


def _slake_records() -> list[dict]:
    """SLAKE's published record layout (``img_name`` under ``imgs/``, ``q_lang``), two languages."""
    base = {"img_id": 1, "img_name": "xmlab1/source.jpg", "location": "Lung", "modality": "X-Ray",
            "content_type": "Modality", "base_type": "vqa"}  # fmt: skip
    return [
        {**base, "qid": 1, "question": "Which modality is used?", "answer": "X-Ray", "q_lang": "en",
         "answer_type": "OPEN"},
        {**base, "qid": 2, "question": "Is the lung healthy?", "answer": "No", "q_lang": "en", "answer_type": "CLOSED"},
        {**base, "qid": 3, "question": "这是什么模态?", "answer": "X光", "q_lang": "zh", "answer_type": "OPEN"},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """One data folder per JSON layout, images in place; the fuzzed JSON is written over ``<folder>/<file>``."""
    top = tmp_path_factory.mktemp("fuzz_medvl")
    llava = top / "llava"
    (llava / "images").mkdir(parents=True)
    for record in _llava_records():
        for key in ("image", "target_image"):
            if key in record:
                shutil.copy(EMBEDDED / record[key], llava / record[key])
    (llava / "train.json").write_text(json.dumps(_llava_records()))
    rad = top / "vqa_rad"
    shutil.copytree(VQA_RAD_JSON.parent, rad)
    mevf = top / "mevf"
    shutil.copytree(REAL / "vqa_rad_mevf", mevf)
    slake = top / "slake"
    (slake / "imgs" / "xmlab1").mkdir(parents=True)
    shutil.copy(JPEG, slake / "imgs" / "xmlab1" / "source.jpg")
    (slake / "train.json").write_text(json.dumps(_slake_records(), ensure_ascii=False))
    return {"llava": llava / "train.json", "vqa-rad": rad / VQA_RAD_JSON.name, "mevf": mevf / "trainset.json",
            "slake": slake / "train.json"}  # fmt: skip


def read_layout(layout: str, path: Path):
    """The reader a run uses on ``path`` (bad records skipped): the folder for MEVF's pair, else the JSON."""
    skipped = SkipReport()
    if layout == "mevf":
        return read_folder(path.parent, skipped=skipped, language="all")
    if layout == "vqa-rad":
        return read_folder(path, skipped=skipped)
    return read_json(path, skipped=skipped, language="all")


def check_samples(samples, folder: Path) -> None:
    """What a successful read gives: samples of text, with images inside the data folder."""
    parts = samples.values() if isinstance(samples, dict) else [samples]
    for sample in (s for part in parts for s in part):
        assert isinstance(sample, VlSample) and isinstance(sample.question, str) and isinstance(sample.answer, str)
        for image in (sample.image, sample.target_image):
            assert image is None or (image.exists() and image.is_relative_to(folder.resolve())), image


# --- structure-aware JSON --------------------------------------------------------------------------------------------

#: Text a hostile or broken export may hold: right-to-left override, emoji, NUL, a lone surrogate, paths out of the
#: folder, image tokens, an enormous string.
ODD_TEXT = st.one_of(
    st.sampled_from(["\u202egpj.ecruos\u202c", "🩻🫁 lung?", "a\x00b.png", "\ud800", "../" * 40 + "x.png",
                     "/etc/passwd", "", "   ", "<image>" * 3, "<idx_99999999999>", "x" * 1_000_000,
                     "images/" + "a" * 300 + ".png"]),
    st.text(max_size=40),
)  # fmt: skip
#: JSON values of the wrong type for any field.
ODD_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    ODD_TEXT,
    st.lists(st.one_of(st.none(), st.integers(), ODD_TEXT), max_size=3),
    st.dictionaries(ODD_TEXT, st.one_of(st.none(), st.integers(), ODD_TEXT), max_size=3),
)
#: Raw JSON text put in place of a value: deep nesting, an integer past Python's 4300-digit limit, NaN literals.
RAW = st.sampled_from(["[" * 100 + "]" * 100, "[" * 100_000 + "]" * 100_000, "{\"a\":" * 5000 + "1" + "}" * 5000,
                       "1" * 5000, "NaN", "-Infinity", "1e999"])  # fmt: skip
_RAW_MARK = "@@raw@@"


def _paths(value, prefix=()):
    """Every (key path) into the nested dicts and lists of ``value``."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, inner in items:
        yield (*prefix, key)
        yield from _paths(inner, (*prefix, key))


@st.composite
def odd_json(draw, records: list) -> bytes:
    """``records`` (a JSON list) after 1..3 of: a value replaced by one of another type or odd text, a key removed,
    a record replaced, raw text (deep nesting, huge integers) in place of a value; or the whole file replaced."""
    data = copy.deepcopy(records)
    raw = None
    if draw(st.integers(0, 9)) == 0:
        data = draw(st.one_of(ODD_VALUE, st.just(_RAW_MARK)))
        raw = draw(RAW)
    else:
        for _ in range(draw(st.integers(1, 3))):
            paths = list(_paths(data))
            *parent, key = draw(st.sampled_from(paths))
            holder = data
            for step in parent:
                holder = holder[step]
            kind = draw(st.sampled_from(["retype", "text", "drop", "raw"]))
            if kind == "drop" and isinstance(holder, dict):
                del holder[key]
            elif kind == "raw" and raw is None:
                holder[key], raw = _RAW_MARK, draw(RAW)
            else:
                holder[key] = draw(ODD_TEXT if kind == "text" else ODD_VALUE)
    text = json.dumps(data, ensure_ascii=draw(st.booleans()), allow_nan=True)
    if raw is not None:
        text = text.replace(json.dumps(_RAW_MARK), raw, 1)
    return text.encode("utf-8", "surrogatepass")


JSON_LAYOUTS = ["llava", "vqa-rad", "mevf", "slake"]


@pytest.mark.parametrize("profile", DEPTHS)
@pytest.mark.parametrize("layout", JSON_LAYOUTS)
def test_mutated_json_bytes_are_read_or_refused(folders, layout, profile):
    path = folders[layout]
    original = path.read_bytes()

    @profile
    @given(mutated(original))
    def run(data: bytes) -> None:
        path.write_bytes(data)
        result = check_read_or_refused(lambda: read_layout(layout, path), path)
        count(f"{layout}-bytes", profile, result)
        if result is not None:
            check_samples(result, path.parent)

    try:
        run()
    finally:
        path.write_bytes(original)


@pytest.mark.parametrize("profile", DEPTHS)
@pytest.mark.parametrize("layout", JSON_LAYOUTS)
def test_wrongly_typed_odd_and_nested_json_is_read_or_refused(folders, layout, profile):
    path = folders[layout]
    original = path.read_bytes()

    @profile
    @given(odd_json(json.loads(original)))
    def run(data: bytes) -> None:
        path.write_bytes(data)
        result = check_read_or_refused(lambda: read_layout(layout, path), path)
        count(f"{layout}-json", profile, result)
        if result is not None:
            check_samples(result, path.parent)

    try:
        run()
    finally:
        path.write_bytes(original)


# --- images --------------------------------------------------------------------------------------------------------

IMAGES = {"png": PNG, "jpeg": JPEG, "dicom": DICOM, "nifti": NIFTI}
HUGE = [0, 1, 31, 65_535, 100_000, 2**31 - 1, 2**32 - 1]
DICOM_SIZES = ["Rows", "Columns", "BitsAllocated", "SamplesPerPixel", "NumberOfFrames", "PixelRepresentation"]


def _png_size(original: bytes, width: int, height: int) -> bytes:
    """The PNG with its IHDR width and height replaced (CRC recomputed, so only the size is wrong)."""
    ihdr = bytearray(original[12:29])  # b"IHDR" + 13 bytes
    ihdr[4:12] = struct.pack(">II", width, height)
    return original[:8] + original[8:12] + bytes(ihdr) + struct.pack(">I", zlib.crc32(ihdr)) + original[33:]


def _jpeg_size(original: bytes, width: int, height: int) -> bytes:
    """The JPEG with its frame header's (SOF) height and width replaced."""
    data = bytearray(original)
    at = next(i for i in range(2, len(data) - 9) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2))
    data[at + 5 : at + 9] = struct.pack(">HH", min(height, 65_535), min(width, 65_535))
    return bytes(data)


@st.composite
def absurd_header(draw, kind: str, original: bytes, folder: Path) -> bytes:
    """``original`` with the sizes its header declares replaced by absurd ones (pixel data unchanged)."""
    if kind == "png":
        return _png_size(original, draw(st.sampled_from(HUGE)), draw(st.sampled_from(HUGE)))
    if kind == "jpeg":
        return _jpeg_size(original, draw(st.sampled_from(HUGE)), draw(st.sampled_from(HUGE)))
    if kind == "dicom":
        dataset = pydicom.dcmread(DICOM)
        for name in draw(st.lists(st.sampled_from(DICOM_SIZES), min_size=1, max_size=3)):
            value = draw(st.sampled_from([0, 1, 3, 7, 64, 65_535]))
            setattr(dataset, name, str(value) if name == "NumberOfFrames" else value)
        out = folder / "header.dcm"
        dataset.save_as(out)
        return out.read_bytes()
    header = nibabel.load(NIFTI).header.copy()
    dims = list(header["dim"])
    for axis in draw(st.lists(st.integers(0, 7), min_size=1, max_size=3)):
        dims[axis] = draw(st.sampled_from([-1, 0, 1, 7, 16, 1024, 32_767]))
    header["dim"] = dims
    if draw(st.booleans()):
        header["datatype"] = draw(st.sampled_from([0, 1, 32, 128, 255, 1792, 2304]))
    if draw(st.booleans()):
        header["vox_offset"] = draw(st.sampled_from([0.0, 1e30, -352.0, float("nan")]))
    return header.binaryblock + original[348:]


def _read_image(path: Path):
    image = load_image(path, source=f"fuzz.json record 0 ({path.name})")
    assert image.shape == (1, 64, 64) and image.dtype == torch.float32
    assert torch.isfinite(image).all() and 0 <= float(image.min()) and float(image.max()) <= 1
    return image


@pytest.mark.parametrize("profile", DEPTHS)
@pytest.mark.parametrize("kind", list(IMAGES))
def test_mutated_image_bytes_are_read_or_refused(tmp_path, kind, profile):
    original = IMAGES[kind].read_bytes()
    path = tmp_path / f"fuzzed{''.join(IMAGES[kind].suffixes)}"

    @profile
    @given(mutated(original))
    def run(data: bytes) -> None:
        path.write_bytes(data)
        count(f"{kind}-bytes", profile, check_read_or_refused(lambda: _read_image(path), path))

    run()


@pytest.mark.parametrize("profile", DEPTHS)
@pytest.mark.parametrize("kind", list(IMAGES))
def test_images_with_absurd_header_sizes_are_read_or_refused(tmp_path, kind, profile):
    original = IMAGES[kind].read_bytes()
    path = tmp_path / f"fuzzed{''.join(IMAGES[kind].suffixes)}"

    @profile
    @given(absurd_header(kind, original, tmp_path))
    def run(data: bytes) -> None:
        path.write_bytes(data)
        count(f"{kind}-header", profile, check_read_or_refused(lambda: _read_image(path), path))

    run()


def test_a_nifti_header_whose_dims_multiply_past_int64_is_refused_for_its_size(tmp_path):
    """Found while writing the header fuzzer: 1024⁶ × 16 = 2⁶⁴ voxels wrapped to 0 in NumPy's int64 product and
    passed the size check (nibabel then failed with an OverflowError about index sizes)."""
    header = nibabel.load(NIFTI).header.copy()
    header["dim"] = [7, 1024, 1024, 1024, 1024, 1024, 1024, 16]
    path = tmp_path / "wrapped.nii"
    path.write_bytes(header.binaryblock + NIFTI.read_bytes()[348:])
    with pytest.raises(UserError, match=r"wrapped\.nii is 1024 × .* × 16 px \(18,446,744,073,709,551,616 pixels\)"):
        load_image(path)


@pytest.mark.parametrize(
    "name, problem",
    [("a\x00b.png", "embedded null byte"), ("\ud800.png", "surrogates not allowed"), ("x" * 100_000, "too long"),
     ("images/loop.png", "loop")],
    ids=["nul", "lone-surrogate", "enormous", "link-loop"],
)  # fmt: skip
def test_an_unusable_image_path_is_a_bad_record_naming_the_field(folders, name, problem):
    """Found by the fuzzer (the first three; the loop of links by reading what it raised): OS errors, ValueError and
    RuntimeError from the path itself escaped as tracebacks."""
    folder = folders["llava"].parent
    loop = folder / "images" / "loop.png"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    record = {**_llava_records()[0], "image": name}
    path = folder / "unusable.json"
    path.write_text(json.dumps([record]))
    expected = r"unusable\.json: record 0 \(.*\): field 'image': expected a file path"
    with pytest.raises(BadRecordError, match=expected) as caught:
        read_json(path)
    assert problem in str(caught.value)


@pytest.mark.parametrize("raw, problem", [("[" * 100_000 + "]" * 100_000, "nested deeper"),
                                          ("[" + "1" * 5000 + "]", "4300")], ids=["deep", "huge-int"])  # fmt: skip
def test_json_python_cannot_parse_is_refused_naming_the_file(tmp_path, raw, problem):
    """Found by the fuzzer: RecursionError and the integer-digits ValueError escaped `json.loads`."""
    path = tmp_path / "train.json"
    path.write_text(raw)
    with pytest.raises(UserError, match=rf"train\.json: .*{problem}"):
        read_json(path)


@pytest.mark.parametrize(
    "dim, problem",
    [([1, 33, 1, 1, 1, 1, 1, 1], r"is 1-D \(shape \[1, 33\]\); expected a 2-D image"),
     ([3, 33, 41, 0, 1, 1, 1, 1], r"has shape \[1, 41, 33, 0\]; expected no empty axis")],
    ids=["1-D", "empty-axis"],
)  # fmt: skip
def test_a_nifti_of_one_axis_or_an_empty_one_is_refused(tmp_path, dim, problem):
    """Found by the deep fuzz runs: a NIfTI header with dim[0] = 1 gave a 1-D array that the reader transposed, one
    with a 0-long axis an empty volume whose middle slice it took (IndexError both)."""
    header = nibabel.load(NIFTI).header.copy()
    header["dim"] = dim
    path = tmp_path / "odd.nii"
    path.write_bytes(header.binaryblock + NIFTI.read_bytes()[348:])
    with pytest.raises(UserError, match=rf"odd\.nii {problem}"):
        load_image(path)


def test_a_dicom_element_longer_than_its_file_is_refused_before_allocation(tmp_path):
    """Found by the fuzzer: a mutated length (here the pixel data's, 2.9 GB in a 39 KB file) was believed, and
    pydicom allocated it (MemoryError under the harness's cap), before the header check or in MONAI's read."""
    data = bytearray(DICOM.read_bytes())
    at = data.find(b"\xe0\x7f\x10\x00OW\x00\x00")  # (7FE0,0010) Pixel Data, OW, then its 4-byte length
    data[at + 8 : at + 12] = struct.pack("<I", 0xAFFFFFF0)
    path = tmp_path / "long.dcm"
    path.write_bytes(data)
    assert check_read_or_refused(lambda: load_image(path), path) is None
    with pytest.raises(UserError, match=r"long\.dcm is not a readable DICOM file: an element at byte 6,300 declares"):
        load_image(path)
