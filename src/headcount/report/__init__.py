"""Reports: figures, the paper's claims checked, the pruning report, the positive control's report."""
