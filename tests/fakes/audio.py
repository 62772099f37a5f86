"""Real audio made in the test, with the standard library only (no ffmpeg, espeak-ng, opusenc).

- ``wav(seconds)``: a 16-bit mono PCM WAV of a sine tone (deterministic bytes);
- ``ogg_opus(seconds)``: an OGG/Opus file as Telegram voice notes and Discord voice messages
  are (RFC 7845: an ``OpusHead`` page, an ``OpusTags`` page, then audio pages with granule
  positions and CRCs), whose packets are Opus's 20 ms silence frame: valid Opus that any
  decoder plays as silence, made without an encoder;
- ``mp3(seconds)``: MPEG-1 Layer III frames that decode to silence;
- ``duration(data)``: the length of a WAV or OGG/Opus file, read from its headers;
- ``ogg_pages(data)``: an OGG stream's pages and their packets, for a test to look inside;
- ``digest(data)``: the key of ``FakeLLM.transcripts`` (sha256, hex).

Each is a pure function of its arguments, so a test can make the same audio twice and look
it up by its digest.
"""

from __future__ import annotations

import hashlib
import io
import math
import struct
import wave
from collections.abc import Iterator

OPUS_SILENCE = b"\xf8\xff\xfe"  # TOC 0xF8 (CELT, fullband, 20 ms, mono, one frame) + silence
OPUS_RATE = 48_000  # granule positions count 48 kHz samples, whatever the input rate
OPUS_PRE_SKIP = 312  # what libopus (and so opusenc and ffmpeg) declares
_FRAME_SAMPLES = OPUS_RATE // 50  # 20 ms
_FRAMES_PER_PAGE = 50  # one second of audio per page, as opusenc writes them
_MP3_HEADER = b"\xff\xfb\x90\xc0"  # MPEG-1 Layer III, no CRC, 128 kbit/s, 44.1 kHz, mono
_MP3_FRAME = 417  # bytes: 144 * 128000 // 44100, no padding
_MP3_SAMPLES = 1152


def digest(data: bytes) -> str:
    """The sha256 of ``data`` as lowercase hex: how ``FakeLLM`` knows an audio again."""
    return hashlib.sha256(data).hexdigest()


def wav(seconds: float, *, rate: int = 16_000, tone_hz: float = 440.0) -> bytes:
    """A mono 16-bit PCM WAV of ``seconds`` of a sine tone at ``tone_hz`` (0: silence).

    The same arguments give the same bytes. ``seconds`` is rounded to whole samples.
    """
    if seconds < 0 or rate <= 0:
        raise ValueError(f"need seconds >= 0 and rate > 0, not {seconds}, {rate}")
    count = round(seconds * rate)
    step = 2 * math.pi * tone_hz / rate
    samples = (round(9830 * math.sin(step * i)) for i in range(count))  # 0.3 of full scale
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(struct.pack(f"<{count}h", *samples))
    return buffer.getvalue()


def ogg_opus(seconds: float, *, serial: int = 0x6E616E6F, vendor: str = "nanobot-fake") -> bytes:
    """An OGG/Opus file of ``seconds`` of silence (rounded to 20 ms frames, at least one).

    ``serial`` is the logical stream's serial number (an encoder picks one at random; a
    different serial gives different bytes for the same length). ``duration`` reads the
    length back from the last page's granule position.
    """
    frames = max(1, round(seconds * 50))
    head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, OPUS_PRE_SKIP, OPUS_RATE, 0, 0)
    encoded = vendor.encode()
    tags = b"OpusTags" + struct.pack("<I", len(encoded)) + encoded + struct.pack("<I", 0)
    pages = [_ogg_page([head], granule=0, serial=serial, sequence=0, flags=0x02)]
    pages.append(_ogg_page([tags], granule=0, serial=serial, sequence=1))
    for sequence, first in enumerate(range(0, frames, _FRAMES_PER_PAGE), start=2):
        count = min(_FRAMES_PER_PAGE, frames - first)
        granule = OPUS_PRE_SKIP + (first + count) * _FRAME_SAMPLES
        eos = 0x04 if first + count == frames else 0
        packets = [OPUS_SILENCE] * count
        pages.append(
            _ogg_page(packets, granule=granule, serial=serial, sequence=sequence, flags=eos)
        )
    return b"".join(pages)


def mp3(seconds: float) -> bytes:
    """MPEG-1 Layer III frames of silence (a header and zeroed side information each: no
    bits of main data, which a decoder plays as silence), ``seconds`` rounded to frames."""
    frames = max(1, round(seconds * 44_100 / _MP3_SAMPLES))
    return (_MP3_HEADER + bytes(_MP3_FRAME - len(_MP3_HEADER))) * frames


def duration(data: bytes) -> float | None:
    """Seconds of audio in a WAV (frames / rate) or an OGG/Opus file ((last granule position
    - pre-skip) / 48000, RFC 7845); None for anything else or a file it cannot read."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        try:
            with wave.open(io.BytesIO(data)) as audio:
                frames, rate = int(audio.getnframes()), int(audio.getframerate())
        except (wave.Error, EOFError):
            return None
        return frames / rate if rate else None
    if data[:4] == b"OggS":
        return _opus_duration(data)
    return None


def ogg_pages(data: bytes) -> Iterator[tuple[int, int, int, list[bytes]]]:
    """Each page of an OGG stream as ``(flags, granule, serial, packets)``; a packet that goes
    on to the next page is returned with each page's part of it. Raises ValueError on a
    page without the ``OggS`` capture pattern or cut short."""
    offset = 0
    while offset < len(data):
        if data[offset : offset + 4] != b"OggS" or len(data) < offset + 27:
            raise ValueError(f"no OGG page at byte {offset}")
        flags, granule, serial, _, _, count = struct.unpack_from("<xBqIIIB", data, offset + 4)
        lacing = data[offset + 27 : offset + 27 + count]
        body = offset + 27 + count
        end = body + sum(lacing)
        if end > len(data):
            raise ValueError(f"the OGG page at byte {offset} is cut short")
        packets, start, size = [], body, 0
        for value in lacing:
            size += value
            if value < 255:
                packets.append(data[start : start + size])
                start, size = start + size, 0
        if size:
            packets.append(data[start : start + size])
        yield flags, granule, serial, packets
        offset = end


def _opus_duration(data: bytes) -> float | None:
    pre_skip, last = None, 0
    try:
        for _, granule, _, packets in ogg_pages(data):
            if pre_skip is None:
                if not packets or not packets[0].startswith(b"OpusHead") or len(packets[0]) < 12:
                    return None
                pre_skip = struct.unpack_from("<H", packets[0], 10)[0]
            if granule > 0:
                last = granule
    except ValueError:
        return None
    return None if pre_skip is None else max(0, last - pre_skip) / OPUS_RATE


def _ogg_page(
    packets: list[bytes], *, granule: int, serial: int, sequence: int, flags: int = 0
) -> bytes:
    """One page holding whole ``packets`` (at most 255 lacing values: the callers' packets
    are small)."""
    lacing = bytearray()
    for packet in packets:
        lacing += b"\xff" * (len(packet) // 255) + bytes([len(packet) % 255])
    if len(lacing) > 255:
        raise ValueError("too many packets for one OGG page")
    header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, serial, sequence, 0, len(lacing))
    page = bytearray(header + lacing + b"".join(packets))
    struct.pack_into("<I", page, 22, _ogg_crc(page))
    return bytes(page)


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = (crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1
        table.append(crc & 0xFFFFFFFF)
    return table


_CRC_TABLE = _crc_table()


def _ogg_crc(data: bytes | bytearray) -> int:
    """OGG's CRC-32: polynomial 0x04C11DB7, not reflected, initial value and final XOR 0
    (not zlib's), over the page with its CRC field zeroed."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC_TABLE[((crc >> 24) ^ byte) & 0xFF]
    return crc
