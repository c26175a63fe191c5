"""EEG domain: readers of published layouts and of any EDF/BDF/GDF/FIF/BrainVision folder (through MNE) into
labelled windows, and the channel contract between a recording and a model's channels.

Readers: `read_sleep_edf` (Sleep-EDF Expanded, sleep cassette), `read_bci_iv_2a` (BCI Competition IV 2a GDF),
`read_bnci_2a_mat` (the same data in the BNCI/MOABB ``.mat`` layout), `read_eegmmidb` (PhysioNet EEG Motor
Movement/Imagery), `read_eeg_folder` (any folder with a user-given annotation -> class mapping). Each returns
`EegWindows` [µV]. Channel contract: `select_channels`, `standardize_channel_name`. The sleep simulator (what
other domains may use: a domain imports another only through its package): `draw_sleep_subjects`,
`simulate_night` at `PSG_RATE_HZ`.
"""

from workbench.domains.eeg.channels import ChannelSelection, select_channels, standardize_channel_name
from workbench.domains.eeg.motor import (
    BCI2A_CHANNELS,
    BCI2A_CLASSES,
    EEGMMIDB_CHANNELS,
    EEGMMIDB_CLASSES,
    read_bci_iv_2a,
    read_bnci_2a_mat,
    read_eegmmidb,
)
from workbench.domains.eeg.readers import EegWindows, read_eeg_folder, read_recording
from workbench.domains.eeg.sleep_simulator import PSG_RATE_HZ, draw_sleep_subjects, simulate_night
from workbench.domains.eeg.sleepedf import SLEEP_CLASSES, SLEEP_EDF_CHANNELS, read_sleep_edf

from workbench.core.records import BadRecordError, RecordProblem, SkipReport

__all__ = [
    "PSG_RATE_HZ",
    "draw_sleep_subjects",
    "simulate_night",
    "BCI2A_CHANNELS",
    "BCI2A_CLASSES",
    "EEGMMIDB_CHANNELS",
    "EEGMMIDB_CLASSES",
    "SLEEP_CLASSES",
    "SLEEP_EDF_CHANNELS",
    "BadRecordError",
    "ChannelSelection",
    "EegWindows",
    "RecordProblem",
    "SkipReport",
    "read_bci_iv_2a",
    "read_bnci_2a_mat",
    "read_eeg_folder",
    "read_eegmmidb",
    "read_recording",
    "read_sleep_edf",
    "select_channels",
    "standardize_channel_name",
]
