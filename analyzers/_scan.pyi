"""Types of the C scanner (analyzers/_scan.c)."""

from typing import Callable

class Scanner:
    def __init__(self, intern_name: Callable[[str | None], tuple[int, int]],
                 intern_cat: Callable[[str], tuple[int, int]]) -> None: ...
    def scan(self, body: bytes | bytearray | memoryview, /) -> tuple[
        int, bool, float | None, tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...], bytes, bytes, bytes] | None: ...
