"""Atomistic domain: rMD17/extended-XYZ readers, data generators with xTB and DFT, the ``rmd17`` task."""
