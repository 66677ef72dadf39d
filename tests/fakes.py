"""Small stand-ins the unit tests share."""


class PieceSegmenter:
    """Each word into pieces of at most 3 characters, the first with '▁', as sentencepiece marks a
    word start; ids 4 .. 4 + ids - 1 assigned on first use (0-3 are the special ids)."""

    def __init__(self, ids: int = 60):
        self.vocab: dict[str, int] = {}
        self.ids = ids

    def pieces(self, line: str) -> list[str]:
        out = []
        for word in line.split():
            chunks = [word[i:i + 3] for i in range(0, len(word), 3)]
            out += ["▁" + chunks[0]] + chunks[1:]
        return out

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [[self.vocab.setdefault(p, 4 + len(self.vocab) % self.ids) for p in self.pieces(line)] for line in lines]
