"""Zip bombs: small signed batches whose zstd payload expands to gigabytes are rejected unexpanded.

The frames are built by hand from RLE blocks (3-byte header + 1 byte, each expanding to 128 KiB), so
building them costs nothing either. zstd cannot expand more than 128 KiB per ~4 bytes of block, so a
4 KiB frame holds 128 MiB and a 128 KiB frame holds 4 GiB.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from protocol import Identity, MalformedError, ProtocolError, TooLargeError, decode_batch
from protocol._wire import KIND_BATCH, seal

BLOCK = 128 * 1024
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def rle_frame(declared: int | None, n_blocks: int) -> bytes:
    """A zstd frame of ``n_blocks`` RLE blocks of zero bytes (``n_blocks * 128 KiB`` when expanded).

    ``declared`` is the content size written in the header (it may lie); ``None`` writes none.
    """
    if declared is None:
        header = ZSTD_MAGIC + bytes([0x00, 7 << 3])  # no content size; window descriptor: 128 KiB
    else:
        header = ZSTD_MAGIC + bytes([0xE0]) + struct.pack("<Q", declared)  # single segment, 8-byte size
    block = ((BLOCK << 3) | (1 << 1)).to_bytes(3, "little") + b"\x00"
    last = ((BLOCK << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\x00"
    return header + block * (n_blocks - 1) + last


def peak_traced(identity: Identity, payload: bytes, error: type[ProtocolError]) -> int:
    data = seal(KIND_BATCH, identity, payload)
    tracemalloc.start()
    try:
        with pytest.raises(error):
            decode_batch(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_frames_are_what_they_claim() -> None:
    import zstandard

    small = rle_frame(3 * BLOCK, 3)
    assert zstandard.ZstdDecompressor().decompress(small) == bytes(3 * BLOCK)
    assert len(rle_frame(1024 * BLOCK, 1024)) == 13 + 4 * 1024  # 4 KiB -> 128 MiB


@pytest.mark.parametrize(
    "payload,error",
    [
        (rle_frame(1024 * BLOCK, 1024), TooLargeError),  # 4 KiB -> 128 MiB, honest header
        (rle_frame(32768 * BLOCK, 32768), TooLargeError),  # 128 KiB -> 4 GiB, honest header
        (rle_frame(2**62, 8), TooLargeError),  # a few bytes claiming 4 EiB
        (rle_frame(BLOCK, 32768), MalformedError),  # claims 128 KiB, holds 4 GiB
        (rle_frame(None, 32768), MalformedError),  # no declared size
    ],
    ids=["4KiB-128MiB", "128KiB-4GiB", "claims-4EiB", "lying-size-4GiB", "unsized-4GiB"],
)
def test_bomb_rejected_with_low_peak_memory(
    identity: Identity, payload: bytes, error: type[ProtocolError]
) -> None:
    # Peak Python allocation while decoding: copies of the input plus at most one 128 KiB block.
    assert peak_traced(identity, payload, error) < 3 * len(payload) + 2 * BLOCK + 64 * 1024


def test_bomb_process_peak_rss() -> None:
    """Whole-process peak RSS (C allocations included) stays within the decompressed-size limit."""
    script = textwrap.dedent(
        f"""
        import resource
        from protocol import Identity, ProtocolError, decode_batch
        from protocol._wire import KIND_BATCH, seal
        from tests.protocol.test_zip_bomb import rle_frame
        ident = Identity.generate()
        bombs = [seal(KIND_BATCH, ident, rle_frame(d, n)) for d, n in
                 [({32768 * BLOCK}, 32768), ({BLOCK}, 32768), (None, 32768), ({32 * 2**20}, 32768)]]
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for bomb in bombs:
            try:
                decode_batch(bomb)
            except ProtocolError as exc:
                print(type(exc).__name__, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
        """
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=root,
        env=env,
    )
    rows = [line.split() for line in out.stdout.splitlines()]
    assert [row[0] for row in rows] == ["TooLargeError", "MalformedError", "MalformedError", "MalformedError"]
    grown_kib = [int(row[1]) for row in rows]
    # Three 4 GiB bombs (honest, lying, unsized header) cost next to nothing ...
    assert grown_kib[2] < 8 * 1024, grown_kib
    # ... and one that declares exactly the 32 MiB limit while holding 4 GiB stops at the limit.
    assert grown_kib[3] < 32 * 1024 + 8 * 1024, grown_kib
