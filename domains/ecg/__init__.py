"""ECG domain: WFDB readers (PTB-XL, PhysioNet/CinC 2021), H-Tuning's preprocessing, a synthetic 12-lead set.

What other domains may use (a domain imports another only through its package): `read_raw_record`, one checked
WFDB record in mV.
"""

from workbench.domains.ecg.wfdb_record import RawEcg, read_raw_record

__all__ = ["RawEcg", "read_raw_record"]
