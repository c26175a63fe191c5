"""ECG domain: WFDB readers (PTB-XL, PhysioNet/CinC 2021), H-Tuning's preprocessing, a synthetic 12-lead set."""
