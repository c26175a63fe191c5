"""Synthetic 2-D cross-sections with recorded lesions, as VQA pairs, reports and image-generation tasks in the
LLaVA conversation layout (card ``medvl-synthetic``).

Each subject is one axial cross-section, drawn on a ``size_px`` grid (64 px) in pixel coordinates (row, column;
pixel centres at integers, the image centre at ``(size_px - 1) / 2``):

* a **body**: an ellipse of soft tissue (vertical semi-axis 22-26 px, horizontal 27-30 px, centre within 1 px of
  the image centre) whose outline is smoothly deformed (harmonics 2-4 of the polar radius, each up to ± 3 %), with
  a **subcutaneous fat rim** 2-4 px thick that varies smoothly round the body (harmonics 2 and 3, up to ± 25 %);
* one **organ** inside the soft tissue: an ellipse (0.70-0.80 of the fat-free body's horizontal semi-axis,
  0.72-0.85 of its vertical one, centre jittered by up to 2 px) with its own smooth deformation (harmonics 2-4,
  up to ± 6 %);
* 0-3 **lesions** inside the organ (n drawn uniformly), at most one per image quadrant ("upper left", ...: above /
  below the middle row, left / right of the middle column), each a soft-edged disc of radius 2.0-3.0 px
  ("small") or 4.0-5.5 px ("large"), "bright" or "dark" relative to the organ, placed so that the disc and a 1 px
  margin lie inside the organ and inside its quadrant.

Every boundary is a logistic edge 0.5 px wide (a partial-volume transition, never a hard pixel edge). The tissue
label map (`TISSUES`: air, fat, soft tissue, organ, lesion bright, lesion dark) is where each structure's
membership exceeds 1/2. It is rendered in two modalities that show the same anatomy with different
tissue -> intensity maps (`INTENSITY`):

* ``ct``: attenuation in HU (`CT_HU`: air -1000, fat -100, soft tissue 40, organ 90, bright lesion 190, dark
  lesion 10), displayed through a soft-tissue window (level 40, width 400 HU) onto [0.10, 0.95], plus white
  Gaussian noise of 15 HU (0.032 on that scale): the air background is Gaussian around 0.10 (its noise is not
  clipped);
* ``mr``: a T2-weighted-like contrast (fat bright 0.80, soft tissue 0.25, organ 0.40, bright lesion 0.90 (fluid),
  dark lesion 0.12), times a smooth multiplicative coil bias field (``exp`` of a random quadratic in the image
  coordinates, coefficients of sd 0.12, mean 1 over the body), with Rician noise (the magnitude of the signal plus
  complex Gaussian noise of sd 0.03 per channel): the background is Rayleigh, mean 0.03·sqrt(pi/2) ≈ 0.038 > 0.

Intensities are clipped to [0, 1] and written as 8-bit grayscale PNG. ``<id>_ct_lowres.png`` is the CT image
averaged over 2 × 2 blocks (area averaging) before quantisation.

Records (`generate`) follow LLaVA's conversation layout, 8 per subject: 2 closed questions (yes/no, the answers
balanced per split by choosing, for each question, a kind of question that can give the answer still short),
2 open questions, 1 report (`report_text`), and one record of each generation task (``reconstruct``: ct -> the
same ct; ``super-resolution``: the low-resolution ct -> the ct; ``modality-conversion``: ct -> mr). The
comprehension records of subjects s0001, s0003, ... use the ct image, those of s0002, s0004, ... the mr image.
Questions and answers come from a closed set of lower-case templates (`VOCABULARY` holds every word). Subject k
(s000<k+1>) depends only on the seed and k: its anatomy on ``SeedSequence([seed, k, 0])``, its images' noise on the
subject's ``noise_seed`` drawn there, its questions on ``[seed, k, 1]`` (and on the yes/no answers before it).

Shapes:
    `render` (size, size) float32 in [0, 1]; `label_map` (size, size) uint8 indices into `TISSUES`
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from workbench.core.checkpoint import atomic_folder
from workbench.core.errors import UserError

TASK_TYPES = ("vqa-closed", "vqa-open", "report", "reconstruct", "super-resolution", "modality-conversion")
COMPREHENSION_TASKS = TASK_TYPES[:3]
GENERATION_TASKS = TASK_TYPES[3:]
QUADRANTS = ("upper left", "upper right", "lower left", "lower right")
SIZES = ("small", "large")
INTENSITIES = ("bright", "dark")
MODALITIES = ("ct", "mr")
#: Tissue classes, in the order of the label map's indices.
TISSUES = ("air", "fat", "soft tissue", "organ", "lesion bright", "lesion dark")

#: Lesion radius ranges per size class [px of the 64-px grid].
LESION_RADIUS_PX = {"small": (2.0, 3.0), "large": (4.0, 5.5)}
#: CT attenuation per tissue [HU] and the display window (level, width) [HU] mapped onto `CT_DISPLAY`.
CT_HU = {"air": -1000.0, "fat": -100.0, "soft tissue": 40.0, "organ": 90.0, "lesion bright": 190.0, "lesion dark": 10.0}
CT_WINDOW_HU = (40.0, 400.0)
#: The display range the window maps onto (the air floor stays above 0, so that its noise is not clipped).
CT_DISPLAY = (0.1, 0.95)
CT_NOISE_HU = 15.0
#: CT noise on the display scale (sd; 15 HU).
CT_NOISE_SD = (CT_DISPLAY[1] - CT_DISPLAY[0]) * CT_NOISE_HU / CT_WINDOW_HU[1]
MR_NOISE_SD = 0.03
MR_BIAS_SD = 0.12
EDGE_PX = 0.5
#: Lesion margin to the organ's boundary and to the quadrant's midlines [px].
MARGIN_PX = 1.0
REFERENCE_PX = 64


def _ct_display(hu: float) -> float:
    level, width = CT_WINDOW_HU
    low, high = CT_DISPLAY
    return low + (high - low) * float(np.clip((hu - (level - width / 2)) / width, 0.0, 1.0))


#: Noise-free intensity of each tissue in each modality (in [0, 1]).
INTENSITY = {
    "ct": {tissue: round(_ct_display(hu), 4) for tissue, hu in CT_HU.items()},
    "mr": {"air": 0.0, "fat": 0.80, "soft tissue": 0.25, "organ": 0.40, "lesion bright": 0.90, "lesion dark": 0.12},
}

_NUMBERS = ("none", "one", "two", "three")
Q_ANY = "are there any lesions?"
Q_QUADRANT = "is there a lesion in the {quadrant} quadrant?"
Q_BRIGHT = "is the lesion in the {quadrant} quadrant bright?"
Q_COUNT = "how many lesions are there?"
Q_LARGEST = "where is the largest lesion?"
Q_MODALITY = "what is the imaging modality?"
Q_REPORT = "describe the findings."
Q_GENERATION = {
    "reconstruct": "reconstruct the image.",
    "super-resolution": "increase the resolution of the image.",
    "modality-conversion": "convert the image to mr.",
}
OUTPUT_IMAGE = "<output_image>"
NO_LESIONS = "no lesions."
_LESION_SENTENCE = "a {size} {intensity} lesion in the {quadrant} quadrant."
#: "where is the largest lesion?" is asked only when the largest radius exceeds the next by this [px].
LARGEST_GAP_PX = 1.5


def _words(text: str) -> list[str]:
    """The words and punctuation marks of a template text."""
    return re.findall(r"[a-z]+|[.?,]", text)


def _vocabulary() -> tuple[str, ...]:
    texts = [Q_ANY, Q_COUNT, Q_LARGEST, Q_MODALITY, Q_REPORT, NO_LESIONS, *Q_GENERATION.values(), "yes no"]
    texts += [*_NUMBERS, *MODALITIES, *QUADRANTS, *SIZES, *INTENSITIES]
    texts += [q.format(quadrant="upper left") for q in (Q_QUADRANT, Q_BRIGHT)]
    texts += [_LESION_SENTENCE.format(size="small", intensity="bright", quadrant="upper left")]
    return tuple(sorted({word for text in texts for word in _words(text)}))


#: Every word and punctuation mark of the questions, answers and reports (tokens ``<image>`` and
#: ``<output_image>`` aside).
VOCABULARY = _vocabulary()


@dataclass(frozen=True)
class Lesion:
    """One lesion: its quadrant (`QUADRANTS`), size class (`SIZES`), intensity class relative to the organ
    (`INTENSITIES`), and where it is drawn: centre (row, column) and radius [px of the subject's grid]."""

    quadrant: str
    size: str
    intensity: str
    centre_px: tuple[float, float] | None = None
    radius_px: float | None = None

    def __post_init__(self):
        for name, value, allowed in (
            ("quadrant", self.quadrant, QUADRANTS),
            ("size", self.size, SIZES),
            ("intensity", self.intensity, INTENSITIES),
        ):
            if value not in allowed:
                raise ValueError(f"lesion {name} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class Findings:
    """The recorded findings of one subject: its lesions, in `QUADRANTS` order."""

    lesions: tuple[Lesion, ...] = ()

    def triples(self) -> set[tuple[str, str, str]]:
        """{(quadrant, size, intensity)} of the lesions (what `report_findings` reads back from a report)."""
        return {(lesion.quadrant, lesion.size, lesion.intensity) for lesion in self.lesions}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"lesions": [{quadrant, size, intensity, centre_px, radius_px}, ...]}``."""
        lesions = []
        for lesion in self.lesions:
            item = {"quadrant": lesion.quadrant, "size": lesion.size, "intensity": lesion.intensity}
            if lesion.centre_px is not None:
                item["centre_px"] = [round(float(c), 3) for c in lesion.centre_px]
            if lesion.radius_px is not None:
                item["radius_px"] = round(float(lesion.radius_px), 3)
            lesions.append(item)
        return {"lesions": lesions}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> Findings:
        """The inverse of `to_json` (a dict, or its JSON text)."""
        if isinstance(data, str):
            data = json.loads(data)
        lesions = []
        for item in data["lesions"]:
            centre = item.get("centre_px")
            lesions.append(
                Lesion(
                    quadrant=item["quadrant"],
                    size=item["size"],
                    intensity=item["intensity"],
                    centre_px=None if centre is None else (float(centre[0]), float(centre[1])),
                    radius_px=None if item.get("radius_px") is None else float(item["radius_px"]),
                )
            )
        return cls(tuple(lesions))


@dataclass(frozen=True)
class Outline:
    """A smoothly deformed ellipse: centre (row, column), semi-axes (vertical, horizontal) [px], and harmonics
    (k, cosine, sine) of the relative change of its polar radius: r(θ) = r_ellipse(θ) (1 + Σ c cos kθ + s sin kθ)."""

    centre_px: tuple[float, float]
    axes_px: tuple[float, float]
    harmonics: tuple[tuple[int, float, float], ...] = ()

    def depth(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """How far inside the outline each point is along the ray from the centre [px] (< 0 outside)."""
        dy, dx = rows - self.centre_px[0], cols - self.centre_px[1]
        theta = np.arctan2(dy, dx)
        ay, ax = self.axes_px
        radius = 1.0 / np.sqrt((np.cos(theta) / ax) ** 2 + (np.sin(theta) / ay) ** 2)
        radius = radius * (1.0 + sum(c * np.cos(k * theta) + s * np.sin(k * theta) for k, c, s in self.harmonics))
        return radius - np.hypot(dy, dx)

    def angle(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return np.arctan2(rows - self.centre_px[0], cols - self.centre_px[1])


@dataclass(frozen=True)
class Subject:
    """One subject's anatomy and findings: the body outline, the fat rim (mean thickness [px] and harmonics (k,
    cosine, sine) of its relative variation round the body), the organ outline, the findings, the grid size [px]
    the geometry is given on, and the seed of its acquisitions (noise, bias field) when `render` gets no rng."""

    body: Outline
    fat_px: float
    fat_harmonics: tuple[tuple[int, float, float], ...]
    organ: Outline
    findings: Findings
    size_px: int = REFERENCE_PX
    noise_seed: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the recipe (floats rounded to 4 decimals)."""

        def rounded(value):
            if isinstance(value, float):
                return round(value, 4)
            if isinstance(value, (list, tuple)):
                return [rounded(v) for v in value]
            if isinstance(value, dict):
                return {k: rounded(v) for k, v in value.items()}
            return value

        out = rounded({k: v for k, v in asdict(self).items() if k != "findings"})
        out["findings"] = self.findings.to_json()
        return out


def _harmonics(rng: np.random.Generator, orders, amplitude: float) -> tuple[tuple[int, float, float], ...]:
    """Harmonics whose amplitude sqrt(c² + s²) is uniform in [0, amplitude], random phase."""
    out = []
    for k in orders:
        a, phase = rng.uniform(0.0, amplitude), rng.uniform(0.0, 2 * np.pi)
        out.append((int(k), float(a * np.cos(phase)), float(a * np.sin(phase))))
    return tuple(out)


def _fat_thickness(subject: Subject, theta: np.ndarray) -> np.ndarray:
    variation = sum(c * np.cos(k * theta) + s * np.sin(k * theta) for k, c, s in subject.fat_harmonics)
    return subject.fat_px * (1.0 + variation)


def _in_quadrant(quadrant: str, row: float, col: float, radius: float, mid: float) -> bool:
    upper, left = quadrant.startswith("upper"), quadrant.endswith("left")
    clear = radius + MARGIN_PX
    vertical = mid - row if upper else row - mid
    horizontal = mid - col if left else col - mid
    return vertical >= clear and horizontal >= clear


def _place_lesion(rng, organ: Outline, quadrant: str, radius: float, mid: float) -> tuple[float, float] | None:
    """A centre (row, column) in ``quadrant`` where the disc and its margin lie inside the organ, or None."""
    ring = np.linspace(0.0, 2 * np.pi, 24, endpoint=False)
    upper, left = quadrant.startswith("upper"), quadrant.endswith("left")
    ay, ax = organ.axes_px
    for _ in range(200):
        row = mid + (-1 if upper else 1) * rng.uniform(radius + MARGIN_PX, ay * 1.1)
        col = mid + (-1 if left else 1) * rng.uniform(radius + MARGIN_PX, ax * 1.1)
        edge = radius + MARGIN_PX
        inside = organ.depth(row + edge * np.sin(ring), col + edge * np.cos(ring))
        if _in_quadrant(quadrant, row, col, radius, mid) and organ.depth(np.array(row), np.array(col)) > edge:
            if (inside > 0).all():
                return float(row), float(col)
    return None


def sample_subject(rng: np.random.Generator, *, size: int = REFERENCE_PX) -> Subject:
    """Draw one subject (anatomy, then 0-3 lesions as the module docstring says) from ``rng`` on a ``size``-px
    grid (lengths scale with ``size`` / 64)."""
    scale = size / REFERENCE_PX
    mid = (size - 1) / 2
    while True:
        body = Outline(
            centre_px=(mid + rng.uniform(-1, 1) * scale, mid + rng.uniform(-1, 1) * scale),
            axes_px=(rng.uniform(22, 26) * scale, rng.uniform(27, 30) * scale),
            harmonics=_harmonics(rng, (2, 3, 4), 0.03),
        )
        fat_px = rng.uniform(2.0, 4.0) * scale
        fat_harmonics = _harmonics(rng, (2, 3), 0.25)
        inner_y, inner_x = body.axes_px[0] - 1.25 * fat_px, body.axes_px[1] - 1.25 * fat_px
        organ = Outline(
            centre_px=(body.centre_px[0] + rng.uniform(-2, 2) * scale, body.centre_px[1] + rng.uniform(-2, 2) * scale),
            axes_px=(rng.uniform(0.72, 0.85) * inner_y, rng.uniform(0.70, 0.80) * inner_x),
            harmonics=_harmonics(rng, (2, 3, 4), 0.06),
        )
        n_lesions = int(rng.integers(0, 4))
        quadrants = sorted(rng.choice(len(QUADRANTS), size=n_lesions, replace=False).tolist())
        lesions = []
        for q in quadrants:
            size_class = SIZES[int(rng.integers(0, 2))]
            intensity = INTENSITIES[int(rng.integers(0, 2))]
            radius = rng.uniform(*LESION_RADIUS_PX[size_class]) * scale
            centre = _place_lesion(rng, organ, QUADRANTS[q], radius, mid)
            if centre is None:
                break
            lesions.append(Lesion(QUADRANTS[q], size_class, intensity, centre, float(radius)))
        if len(lesions) == n_lesions:  # else: this organ has no room for a lesion; draw the subject again
            return Subject(
                body=body,
                fat_px=float(fat_px),
                fat_harmonics=fat_harmonics,
                organ=organ,
                findings=Findings(tuple(lesions)),
                size_px=size,
                noise_seed=int(rng.integers(0, 2**31 - 1)),
            )


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _memberships(subject: Subject, size: int) -> dict[str, np.ndarray]:
    """Soft memberships (size, size) in [0, 1] of the body, the fat-free interior, the organ and each lesion."""
    step = subject.size_px / size
    coords = (np.arange(size) + 0.5) * step - 0.5  # render pixel centres in the subject's grid
    rows, cols = np.meshgrid(coords, coords, indexing="ij")
    width = max(EDGE_PX, 0.5 * step)
    body_depth = subject.body.depth(rows, cols)
    out = {
        "body": _sigmoid(body_depth / width),
        "interior": _sigmoid((body_depth - _fat_thickness(subject, subject.body.angle(rows, cols))) / width),
        "organ": _sigmoid(subject.organ.depth(rows, cols) / width),
    }
    for i, lesion in enumerate(subject.findings.lesions):
        distance = np.hypot(rows - lesion.centre_px[0], cols - lesion.centre_px[1])
        out[f"lesion{i}"] = _sigmoid((lesion.radius_px - distance) / width)
    return out


def label_map(subject: Subject, size: int = REFERENCE_PX) -> np.ndarray:
    """(size, size) uint8 tissue indices into `TISSUES`: each structure where its membership exceeds 1/2."""
    m = _memberships(subject, size)
    labels = np.zeros((size, size), np.uint8)
    labels[m["body"] > 0.5] = TISSUES.index("fat")
    labels[m["interior"] > 0.5] = TISSUES.index("soft tissue")
    labels[m["organ"] > 0.5] = TISSUES.index("organ")
    for i, lesion in enumerate(subject.findings.lesions):
        labels[(m[f"lesion{i}"] > 0.5) & (m["organ"] > 0.5)] = TISSUES.index(f"lesion {lesion.intensity}")
    return labels


def _clean_image(subject: Subject, modality: str, size: int) -> np.ndarray:
    """The noise-free, bias-free intensity (size, size) of ``modality`` (partial-volume mixing at the edges)."""
    table = INTENSITY[modality]
    m = _memberships(subject, size)
    organ = np.full((size, size), table["organ"])
    for i, lesion in enumerate(subject.findings.lesions):
        share = m[f"lesion{i}"]
        organ = organ * (1 - share) + share * table[f"lesion {lesion.intensity}"]
    interior = table["soft tissue"] * (1 - m["organ"]) + organ * m["organ"]
    body = table["fat"] * (1 - m["interior"]) + interior * m["interior"]
    return table["air"] * (1 - m["body"]) + body * m["body"]


def bias_field(subject: Subject, size: int, rng: np.random.Generator) -> np.ndarray:
    """A smooth multiplicative field (size, size): exp of a quadratic in the image coordinates in [-1, 1]
    (coefficients of sd `MR_BIAS_SD`), normalised to mean 1 over the body."""
    y, x = np.meshgrid(np.linspace(-1, 1, size), np.linspace(-1, 1, size), indexing="ij")
    c = rng.normal(0.0, MR_BIAS_SD, 5)
    field = np.exp(c[0] * x + c[1] * y + c[2] * x * y + c[3] * (x**2 - 1 / 3) + c[4] * (y**2 - 1 / 3))
    body = _memberships(subject, size)["body"] > 0.5
    return field / field[body].mean()


def render(subject: Subject, modality: str, size: int = REFERENCE_PX, rng: np.random.Generator | None = None):
    """The subject's image in ``modality`` ("ct" or "mr"), (size, size) float32 in [0, 1].

    ``rng`` draws the noise (and the MR bias field); by default one derived from the subject's ``noise_seed`` and
    the modality, so that a subject always renders the same.
    """
    if modality not in MODALITIES:
        raise UserError(f"modality must be one of {MODALITIES}, got {modality!r}")
    if rng is None:
        rng = np.random.default_rng(np.random.SeedSequence([subject.noise_seed, MODALITIES.index(modality)]))
    clean = _clean_image(subject, modality, size)
    if modality == "ct":
        image = clean + rng.normal(0.0, CT_NOISE_SD, clean.shape)
    else:
        signal = clean * bias_field(subject, size, rng)
        image = np.hypot(signal + rng.normal(0.0, MR_NOISE_SD, clean.shape), rng.normal(0.0, MR_NOISE_SD, clean.shape))
    return np.clip(image, 0.0, 1.0).astype(np.float32)


def downsample(image: np.ndarray, factor: int = 2) -> np.ndarray:
    """Area averaging over ``factor`` × ``factor`` blocks: (h, w) -> (h / factor, w / factor)."""
    h, w = image.shape
    return image.reshape(h // factor, factor, w // factor, factor).mean(axis=(1, 3)).astype(np.float32)


def report_text(findings: Findings) -> str:
    """The templated report: one sentence per lesion in `QUADRANTS` order ("a small bright lesion in the upper
    left quadrant."), or "no lesions."."""
    order = sorted(findings.lesions, key=lambda lesion: QUADRANTS.index(lesion.quadrant))
    if not order:
        return NO_LESIONS
    return " ".join(_LESION_SENTENCE.format(size=x.size, intensity=x.intensity, quadrant=x.quadrant) for x in order)


_FINDING = re.compile(r"\b(small|large)\s+(bright|dark)\s+lesion\s+in\s+the\s+(upper|lower)\s+(left|right)\s+quadrant")


def report_findings(text: str) -> set[tuple[str, str, str]]:
    """{(quadrant, size, intensity)} of every "<size> <intensity> lesion in the <quadrant> quadrant" in ``text``
    (any case, any spacing; whatever else is there is ignored, so junk gives what can be read, often nothing)."""
    return {(f"{v} {h}", size, intensity) for size, intensity, v, h in _FINDING.findall(text.lower())}


@dataclass
class _Balance:
    """The yes / no answers given so far in one split."""

    counts: dict[str, int] = field(default_factory=lambda: {"yes": 0, "no": 0})

    def wanted(self) -> str:
        return "yes" if self.counts["yes"] <= self.counts["no"] else "no"


def _closed_questions(findings: Findings, rng, balance: _Balance) -> list[tuple[str, str]]:
    """Two different yes/no questions, each of a kind (any lesion / lesion in a quadrant / is it bright) that can
    give the answer the split is short of, when one can."""
    by_quadrant = {lesion.quadrant: lesion for lesion in findings.lesions}
    kinds = {
        "any": [(Q_ANY, "yes" if by_quadrant else "no")],
        "quadrant": [(Q_QUADRANT.format(quadrant=q), "yes" if q in by_quadrant else "no") for q in QUADRANTS],
        "bright": [
            (Q_BRIGHT.format(quadrant=q), "yes" if x.intensity == "bright" else "no") for q, x in by_quadrant.items()
        ],
    }
    chosen: list[tuple[str, str]] = []
    for _ in range(2):
        want = balance.wanted()
        left = {kind: [qa for qa in pairs if qa not in chosen] for kind, pairs in kinds.items()}
        fitting = [kind for kind, pairs in left.items() if any(a == want for _, a in pairs)]
        usable = fitting or [kind for kind, pairs in left.items() if pairs]
        kind = usable[int(rng.integers(0, len(usable)))]
        pairs = [qa for qa in left[kind] if qa[1] == want] or left[kind]
        question, answer = pairs[int(rng.integers(0, len(pairs)))]
        chosen.append((question, answer))
        balance.counts[answer] += 1
    return chosen


def _open_questions(findings: Findings, modality: str, rng) -> list[tuple[str, str]]:
    """Two different open questions among the count, the largest lesion's quadrant (asked only when it is clear:
    none, one, or a largest radius `LARGEST_GAP_PX` above the next) and the modality."""
    lesions = sorted(findings.lesions, key=lambda lesion: -lesion.radius_px)
    options = [(Q_COUNT, _NUMBERS[len(lesions)]), (Q_MODALITY, modality)]
    if len(lesions) <= 1 or lesions[0].radius_px - lesions[1].radius_px >= LARGEST_GAP_PX:
        options.append((Q_LARGEST, lesions[0].quadrant if lesions else "none"))
    picks = rng.choice(len(options), size=2, replace=False)
    return [options[i] for i in sorted(picks.tolist())]


def _records(sid: str, subject: Subject, modality: str, rng, balance: _Balance) -> list[dict[str, Any]]:
    """The 8 records of one subject (see the module docstring)."""
    findings = subject.findings.to_json()
    image = f"images/{sid}_{modality}.png"
    records = []

    def add(task, j, question, answer, record_modality, input_image, target=None):
        record = {
            "id": f"{sid}-{task}-{j}",
            "task": task,
            "subject": sid,
            "modality": record_modality,
            "image": input_image,
            "conversations": [
                {"from": "human", "value": f"<image>\n{question}"},
                {"from": "gpt", "value": answer},
            ],
        }
        if target is not None:
            record["target_image"] = target
        record["findings"] = findings
        records.append(record)

    for j, (question, answer) in enumerate(_closed_questions(subject.findings, rng, balance)):
        add("vqa-closed", j, question, answer, modality, image)
    for j, (question, answer) in enumerate(_open_questions(subject.findings, modality, rng)):
        add("vqa-open", j, question, answer, modality, image)
    add("report", 0, Q_REPORT, report_text(subject.findings), modality, image)
    ct, lowres, mr = (f"images/{sid}_{kind}.png" for kind in ("ct", "ct_lowres", "mr"))
    add("reconstruct", 0, Q_GENERATION["reconstruct"], OUTPUT_IMAGE, "ct", ct, ct)
    add("super-resolution", 0, Q_GENERATION["super-resolution"], OUTPUT_IMAGE, "ct", lowres, ct)
    add("modality-conversion", 0, Q_GENERATION["modality-conversion"], OUTPUT_IMAGE, "ct", ct, mr)
    return records


def _write_png(path: Path, image: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(np.round(np.clip(image, 0.0, 1.0) * 255).astype(np.uint8), mode="L").save(path)


def generate(
    out: str | Path,
    seed: int = 0,
    train_subjects: int = 96,
    test_subjects: int = 32,
    size: int = REFERENCE_PX,
    *,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write the synthetic set to ``out``: ``images/<id>_ct.png``, ``<id>_mr.png``, ``<id>_ct_lowres.png``,
    ``train.json``, ``test.json`` (LLaVA conversation records; subjects disjoint) and ``generator.json``.

    Args:
        out: the folder to create.
        seed: the one seed of every random choice (subject k: anatomy from ``SeedSequence([seed, k, 0])``, its
            questions from ``[seed, k, 1]``, its images' noise from the subject's ``noise_seed``).
        train_subjects, test_subjects: subjects per split (subjects s0001... train, the next ones test).
        size: image side [px] (even, at least 32); geometry scales with it.
        overwrite: replace an existing ``out``.

    Returns:
        the summary written to ``generator.json`` (seed, versions, parameters, counts per split and task).
    """
    if train_subjects < 1 or test_subjects < 1:
        raise UserError(f"train_subjects and test_subjects must be at least 1, got {train_subjects}, {test_subjects}")
    if size < 32 or size % 2:
        raise UserError(f"size must be even and at least 32 px, got {size}")
    splits = {"train": range(train_subjects), "test": range(train_subjects, train_subjects + test_subjects)}
    summary = _summary(seed, size, train_subjects, test_subjects)
    with atomic_folder(out, overwrite) as work:
        (work / "images").mkdir()
        for split, numbers in splits.items():
            summary["counts"][split] = _write_split(work, split, numbers, seed, size, summary["subjects"])
        head = json.dumps({k: v for k, v in summary.items() if k != "subjects"}, indent=1)[:-2]
        subjects = ",\n".join(f"  {json.dumps(subject)}" for subject in summary["subjects"])  # one per line
        (work / "generator.json").write_text(f'{head},\n "subjects": [\n{subjects}\n ]\n}}\n')
    return summary


def _summary(seed: int, size: int, train_subjects: int, test_subjects: int) -> dict[str, Any]:
    """`generate`'s summary before any subject is drawn: generator, seed, versions, parameters; empty counts."""
    import PIL

    return {
        "generator": "workbench.domains.medvl.generate.generate",
        "seed": seed,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "parameters": {
            "size_px": size,
            "train_subjects": train_subjects,
            "test_subjects": test_subjects,
            "tissues": list(TISSUES),
            "intensity": INTENSITY,
            "ct_hu": CT_HU,
            "ct_window_hu": list(CT_WINDOW_HU),
            "ct_display": list(CT_DISPLAY),
            "ct_noise_hu": CT_NOISE_HU,
            "mr_rician_noise_sd": MR_NOISE_SD,
            "mr_bias_coefficient_sd": MR_BIAS_SD,
            "lesion_radius_px_at_64": {k: list(v) for k, v in LESION_RADIUS_PX.items()},
            "edge_px": EDGE_PX,
        },
        "counts": {},
        "subjects": [],
    }


def _write_split(
    work: Path, split: str, numbers: range, seed: int, size: int, subjects: list[dict[str, Any]]
) -> dict[str, Any]:
    """Draw and write subjects ``numbers`` (images and ``<split>.json``), append each one's recipe to ``subjects``,
    return the split's counts (subjects, records, tasks, closed answers, lesions per subject)."""
    balance, records = _Balance(), []
    for k in numbers:
        sid = f"s{k + 1:04d}"
        anatomy_rng, question_rng = (
            np.random.default_rng(np.random.SeedSequence([seed, k, stream])) for stream in range(2)
        )
        subject = sample_subject(anatomy_rng, size=size)
        ct, mr = render(subject, "ct", size), render(subject, "mr", size)  # noise from subject.noise_seed
        _write_png(work / "images" / f"{sid}_ct.png", ct)
        _write_png(work / "images" / f"{sid}_mr.png", mr)
        _write_png(work / "images" / f"{sid}_ct_lowres.png", downsample(ct))
        modality = MODALITIES[k % 2]
        records += _records(sid, subject, modality, question_rng, balance)
        subjects.append({"subject": sid, "split": split, **subject.to_json()})
    lines = ",\n".join(json.dumps(record) for record in records)  # one record per line
    (work / f"{split}.json").write_text(f"[\n{lines}\n]\n")
    tasks = {task: sum(r["task"] == task for r in records) for task in TASK_TYPES}
    lesions = [len(r["findings"]["lesions"]) for r in records if r["task"] == "report"]
    return {
        "subjects": len(numbers),
        "records": len(records),
        "tasks": tasks,
        "closed_answers": dict(balance.counts),
        "lesions_per_subject": {_NUMBERS[n]: lesions.count(n) for n in range(4)},
    }
