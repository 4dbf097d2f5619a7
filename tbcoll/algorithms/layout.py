"""How buffers are cut into chunks and segments; every rank cuts them the same way."""


def chunk_bounds(count: int, parts: int) -> list[int]:
    """Split count elements into parts nearly equal chunks: chunk i is [b[i], b[i+1])."""
    return [i * count // parts for i in range(parts + 1)]


def segments(lo: int, hi: int, step: int) -> list[tuple[int, int]]:
    """Cut [lo, hi) into pieces of at most step elements (none if it is empty)."""
    return [(a, min(a + step, hi)) for a in range(lo, hi, step)]
