"""A Bloom filter over the idempotency index's key hashes: "certainly never recorded" without the on-disk index.

Almost every webhook carries a fresh key, and an on-disk lookup of a random 16-byte key costs several
microseconds per key in the group-commit thread; a miss in this filter settles it in about one.
A hit (a known key, or a false positive) falls through to the index, so the filter only has to
never say "absent" for a recorded key:

- bits are only ever set (eviction leaves them: an evicted key costs an index lookup, no more);
- the key hashes are blake2b digests already, so the bit positions are slices of them;
- until `mark_complete` (the keys already on disk were loaded, in the background at start-up) it
  answers "maybe" for everything.

Fixed size, so memory does not grow with the number of keys: 8 MiB holds 10M keys at ~5% false
positives, 1M keys at ~0.01%. Not thread-safe on its own: the index adds under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable

_PROBES = 3  # bit positions per key (unrolled below)


class KeyFilter:
    __slots__ = ("_bits", "_mask", "complete")

    def __init__(self, size_bytes: int) -> None:
        bit_count = 1 << max(10, (size_bytes * 8).bit_length() - 1)  # a power of two: positions are masks
        self._bits = bytearray(bit_count >> 3)
        self._mask = bit_count - 1
        self.complete = False  # the keys recorded before this filter existed are all in it

    # The probes are unrolled (positions from bits 0, 32 and 64 of the hash): this runs per key in
    # the group-commit thread, under the GIL the event loop needs, and a loop costs twice as much.
    def add_all(self, key_hashes: Iterable[bytes]) -> None:
        bits, mask = self._bits, self._mask
        for key in key_hashes:
            value = int.from_bytes(key, "little")
            position = value & mask
            bits[position >> 3] |= 1 << (position & 7)
            position = (value >> 32) & mask
            bits[position >> 3] |= 1 << (position & 7)
            position = (value >> 64) & mask
            bits[position >> 3] |= 1 << (position & 7)

    def might_contain(self, key_hash: bytes) -> bool:
        if not self.complete:
            return True
        bits, mask = self._bits, self._mask
        value = int.from_bytes(key_hash, "little")
        position = value & mask
        if not bits[position >> 3] & (1 << (position & 7)):
            return False
        position = (value >> 32) & mask
        if not bits[position >> 3] & (1 << (position & 7)):
            return False
        position = (value >> 64) & mask
        return bool(bits[position >> 3] & (1 << (position & 7)))

    def clear(self) -> None:
        """Every key forgotten (the index was emptied): nothing recorded, so complete."""
        self._bits[:] = bytes(len(self._bits))
        self.complete = True
