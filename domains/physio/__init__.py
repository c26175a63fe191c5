"""Physiological time series (``workbench.domains.physio``): heartbeats of annotated WFDB records (MIT-BIH
Arrhythmia and any beat-annotated WFDB folder) with their AAMI classes, and generators of multi-site synthetic
ECG in that layout (`workbench.domains.physio.generate`: the embedded sites; `workbench.domains.physio.procedural`:
sites drawn from continuous morphology parameters, the bank's grid and the off-grid targets) — the data side of the
PhysioPFM task."""

from workbench.domains.physio.beats import (
    AAMI_CLASS_OF,
    AAMI_CLASSES,
    DE_CHAZAL_SPLIT,
    PACED_RECORDS,
    BeatSet,
    RecordBeats,
    has_mitbih_names,
    inter_patient_split,
    read_annotated_beats,
    read_beat_folder,
    read_mitbih,
)

__all__ = [
    "AAMI_CLASSES",
    "AAMI_CLASS_OF",
    "BeatSet",
    "has_mitbih_names",
    "DE_CHAZAL_SPLIT",
    "PACED_RECORDS",
    "inter_patient_split",
    "RecordBeats",
    "read_annotated_beats",
    "read_beat_folder",
    "read_mitbih",
]
