"""Medical vision-language data (``workbench.domains.medvl``): questions, reports and image-generation
instructions about 2-D medical images, read from the published layouts (LLaVA conversations as in LLaVA-Med and
VL-Health, VQA-RAD, SLAKE, PathVQA; `workbench.domains.medvl.readers`), images loaded through MONAI
(`workbench.domains.medvl.images`), and a generator of synthetic CT/MR cross-sections with recorded lesions in the
LLaVA layout (`workbench.domains.medvl.generate`, the embedded default).

``images`` is not imported here: it imports MONAI, which the readers and the generator do not need. Nor is the
function ``generate`` re-exported: ``workbench.domains.medvl.generate`` stays the module.
"""

from workbench.domains.medvl.generate import (
    COMPREHENSION_TASKS,
    GENERATION_TASKS,
    MODALITIES,
    QUADRANTS,
    TASK_TYPES,
    TISSUES,
    VOCABULARY,
    Findings,
    Lesion,
    Subject,
    render,
    report_findings,
    report_text,
    sample_subject,
)
from workbench.domains.medvl.readers import (
    LAYOUTS,
    ReadReport,
    VlSample,
    detect_layout,
    read_folder,
    read_json,
    read_questions,
)

__all__ = [
    "COMPREHENSION_TASKS",
    "detect_layout",
    "Findings",
    "GENERATION_TASKS",
    "LAYOUTS",
    "Lesion",
    "MODALITIES",
    "QUADRANTS",
    "read_folder",
    "read_json",
    "read_questions",
    "ReadReport",
    "render",
    "report_findings",
    "report_text",
    "sample_subject",
    "Subject",
    "TASK_TYPES",
    "TISSUES",
    "VlSample",
    "VOCABULARY",
]
