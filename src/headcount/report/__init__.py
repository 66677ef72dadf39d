"""Reports: figures, the paper's claims checked (and intervals over seeds), the pruning report, the
positive control's report."""


def head_label(layer: int, head: int) -> str:
    """A head as every report prints it: layer.head, both counted from 1 (the paper's way)."""
    return f"{int(layer) + 1}.{int(head) + 1}"
