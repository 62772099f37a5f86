"""Tests for ``tests.fakes.audio``: the files it makes are read back by other readers than its
own (the stdlib's ``wave``, discord.py's OGG parser, a bit-by-bit CRC written here)."""

from __future__ import annotations

import io
import itertools
import struct
import wave

import pytest
from discord.oggparse import OggStream

from tests.fakes import audio


def _bitwise_ogg_crc(data: bytes) -> int:
    """RFC 3533's CRC, one bit at a time (the fake uses a table)."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


def _pages(data: bytes) -> list[tuple[int, int, int, int, int, bytes]]:
    """Each page's (flags, granule, serial, sequence, crc, page with the CRC zeroed)."""
    pages, offset = [], 0
    while offset < len(data):
        assert data[offset : offset + 5] == b"OggS\x00"
        flags, granule, serial, sequence, crc, count = struct.unpack_from(
            "<BqIIIB", data, offset + 5
        )
        end = offset + 27 + count + sum(data[offset + 27 : offset + 27 + count])
        page = bytearray(data[offset:end])
        page[22:26] = bytes(4)
        pages.append((flags, granule, serial, sequence, crc, bytes(page)))
        offset = end
    return pages


def test_wav_is_a_pcm_tone_of_the_length_asked() -> None:
    made = audio.wav(0.5, rate=8000, tone_hz=400)
    with wave.open(io.BytesIO(made)) as read:
        assert (read.getnchannels(), read.getsampwidth(), read.getframerate()) == (1, 2, 8000)
        frames = read.readframes(read.getnframes())
    samples = struct.unpack(f"<{len(frames) // 2}h", frames)
    assert len(samples) == 4000
    rising = sum(1 for a, b in itertools.pairwise(samples) if a < 0 <= b)
    assert rising in (199, 200)  # 400 Hz for half a second
    assert max(samples) > 9000 and min(samples) < -9000
    assert audio.wav(0.5, rate=8000, tone_hz=400) == made
    assert audio.wav(0.5, rate=8000, tone_hz=500) != made
    assert audio.duration(made) == 0.5
    silent = audio.wav(0.1, tone_hz=0)
    with wave.open(io.BytesIO(silent)) as read:
        assert set(read.readframes(read.getnframes())) == {0}


@pytest.mark.parametrize("seconds", [0.02, 1.0, 2.5, 61.3])
def test_ogg_opus_is_a_valid_ogg_stream_of_opus_packets(seconds: float) -> None:
    made = audio.ogg_opus(seconds)
    pages = _pages(made)
    assert all(_bitwise_ogg_crc(page) == crc for *_, crc, page in pages)
    assert [sequence for _, _, _, sequence, _, _ in pages] == list(range(len(pages)))
    assert len({serial for _, _, serial, _, _, _ in pages}) == 1
    flags = [f for f, *_ in pages]
    assert flags[0] == 0x02 and flags[-1] == 0x04 and set(flags[1:-1]) <= {0}
    granules = [g for _, g, *_ in pages]
    assert granules[:2] == [0, 0] and granules[2:] == sorted(granules[2:])

    head, tags, *frames = OggStream(io.BytesIO(made)).iter_packets()
    magic, version, channels, pre_skip, rate, gain, family = struct.unpack("<8sBBHIhB", head)
    assert (magic, version, channels, rate, gain, family) == (b"OpusHead", 1, 1, 48000, 0, 0)
    assert tags.startswith(b"OpusTags")
    frame_count = max(1, round(seconds * 50))
    assert frames == [b"\xf8\xff\xfe"] * frame_count  # 20 ms CELT frames of silence
    assert granules[-1] == pre_skip + frame_count * 960
    assert audio.duration(made) == pytest.approx(frame_count / 50)


def test_ogg_opus_serial_changes_the_bytes_not_the_length() -> None:
    one, other = audio.ogg_opus(1.0, serial=1), audio.ogg_opus(1.0, serial=2)
    assert one != other and audio.digest(one) != audio.digest(other)
    assert audio.duration(one) == audio.duration(other) == 1.0
    assert audio.ogg_opus(1.0, serial=1) == one


def test_mp3_is_silent_mpeg1_layer3_frames() -> None:
    made = audio.mp3(1.0)
    frames = [made[i : i + 417] for i in range(0, len(made), 417)]
    assert len(frames) == round(44_100 / 1152) and all(len(f) == 417 for f in frames)
    for frame in frames:
        header = int.from_bytes(frame[:4], "big")
        assert header >> 21 == 0x7FF  # frame sync
        assert (header >> 19) & 3 == 3 and (header >> 17) & 3 == 1  # MPEG-1, Layer III
        assert (header >> 12) & 15 == 9 and (header >> 10) & 3 == 0  # 128 kbit/s, 44.1 kHz
        assert (header >> 6) & 3 == 3  # mono
        assert set(frame[4:]) == {0}


@pytest.mark.parametrize(
    "data",
    [b"", b"junk", b"RIFF\x00\x00\x00\x00WAVEnot really", b"OggS\x00\x02", audio.mp3(1)],
    ids=["empty", "junk", "broken WAV", "cut OGG", "mp3"],
)
def test_duration_is_none_for_what_it_cannot_read(data: bytes) -> None:
    assert audio.duration(data) is None


def test_duration_of_an_ogg_stream_that_is_not_opus_is_none() -> None:
    made = audio.ogg_opus(1.0)
    vorbis = made.replace(b"OpusHead", b"\x01vorbis\x00", 1)
    assert audio.duration(vorbis) is None
    assert audio.duration(made[: len(made) - 10]) is None  # the last page cut short
