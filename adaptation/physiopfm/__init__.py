"""PhysioPFM: a new site's LoRA generated from its class descriptors, not trained (being built, issue 12)."""
