"""`edge-agent package` reads every size a sample input declares before it decodes it: a tiny .npz whose member
declares 3x10^8 floats, a 19 KB PNG of 12,500 x 12,500 pixels, a header that lies about the bytes behind it
are refused by name and size, under a 1 GiB address-space limit, with no MemoryError
(agent/package/inputbudget.py)."""

from __future__ import annotations

import io
import resource
import struct
import subprocess
import zipfile
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from clirunner import EXE, ROOT

from agent.errors import ModelError
from agent.package.inputbudget import Budget, charge_image, default_budget, image_size, read_npy_file, read_npz
from agent.samples import tiny_model

LIMIT = 1 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def package(tmp_path: Path, *args: object) -> subprocess.CompletedProcess:
    """`edge-agent package` on the tiny float model (one [1, 4] input), under a 1 GiB address-space limit."""
    model = tmp_path / "m.onnx"
    if not model.exists():
        onnx.save(tiny_model(), model)
    cmd = EXE + ["package", str(model), *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=_limited)


def npy_bytes(shape: tuple[int, ...], data: bytes, descr: str = "<f4") -> bytes:
    """An .npy stream whose header says `shape` whatever the data holds."""
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, {"descr": descr, "fortran_order": False, "shape": shape})
    return b.getvalue() + data


def png_1bit(path: Path, width: int, height: int) -> Path:
    """A valid 1-bit grayscale PNG of width x height, all black: a few KB that decode to width x height pixels."""
    row = b"\0" + bytes((width + 7) // 8)
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


def refused(r: subprocess.CompletedProcess, name: str, size: int) -> None:
    assert r.returncode not in (0, 70), r.stderr  # 70: an internal error (the old MemoryError)
    assert name in r.stderr and f"{size} bytes" in r.stderr, r.stderr
    assert "MemoryError" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_an_npz_member_declaring_3e8_floats_is_refused_before_it_is_allocated(tmp_path):
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", npy_bytes((300_000_000,), bytes(16)))
    r = package(tmp_path, "--inputs", bomb, "--out", tmp_path / "out")
    refused(r, str(bomb), 300_000_000 * 4)
    assert not (tmp_path / "out").exists()


def test_a_19kb_png_of_12500_squared_pixels_is_refused_from_its_header(tmp_path):
    png = png_1bit(tmp_path / "big.png", 12_500, 12_500)
    assert png.stat().st_size < 64 * 1024 and image_size(png) == (12_500, 12_500)
    r = package(tmp_path, "--inputs", png, "--out", tmp_path / "out")
    refused(r, str(png), 12_500 * 12_500 * 8)


def test_jpeg_and_bmp_sizes_come_from_their_headers(tmp_path):
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0" + bytes(9)
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 9000, 12000, 1) + bytes(3)
    jpeg = tmp_path / "big.jpg"
    jpeg.write_bytes(b"\xff\xd8" + app0 + b"\xff\xc4" + struct.pack(">H", 2) + sof0 + b"\xff\xd9")
    assert image_size(jpeg) == (12000, 9000)
    bmp = tmp_path / "big.bmp"
    bmp.write_bytes(b"BM" + bytes(16) + struct.pack("<ii", 30_000, -20_000) + bytes(28))
    assert image_size(bmp) == (30_000, 20_000)
    with pytest.raises(ModelError, match=r"big\.bmp \(30000x20000 pixels\): 4800000000 bytes decoded is over"):
        charge_image(bmp, Budget(1 << 30))
    (tmp_path / "no.png").write_bytes(b"GIF89a" + bytes(40))
    with pytest.raises(ModelError, match="not a PNG, JPEG or BMP"):
        image_size(tmp_path / "no.png")


def test_the_budget_flag_bounds_honest_inputs_and_lets_them_through_when_they_fit(tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.ones((1, 4), np.float32))
    r = package(tmp_path, "--inputs", x, "--out", tmp_path / "small", "--max-input-bytes", "15")
    refused(r, str(x), 16)
    r = package(tmp_path, "--inputs", x, "--out", tmp_path / "ok", "--max-input-bytes", "16", "--json")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ok" / "test_data_set_0" / "input_0.pb").is_file()


def test_headers_that_lie_about_their_data_are_refused(tmp_path):
    budget = Budget(1 << 20)
    short = tmp_path / "short.npy"
    short.write_bytes(npy_bytes((1000,), bytes(40)))
    with pytest.raises(ModelError, match=r"declares float32\[1000\] = 4000 bytes, the data holds 40"):
        read_npy_file(short, budget)

    # an .npz member whose header declares more than the member's declared uncompressed size
    lying = tmp_path / "lying.npz"
    with zipfile.ZipFile(lying, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", npy_bytes((1000,), bytes(8)))
    with pytest.raises(ModelError, match=r"lying\.npz member 'x\.npy': its header declares .* 4000 bytes, the data"):
        read_npz(lying, Budget(1 << 20))

    # a member whose stream is longer than its declared uncompressed size: zipfile's CRC check, as a refusal
    honest = npy_bytes((4,), np.arange(4, dtype=np.float32).tobytes())
    crc = tmp_path / "crc.npz"
    with zipfile.ZipFile(crc, "w", zipfile.ZIP_STORED) as z:
        z.writestr("x.npy", honest)
    data = bytearray(crc.read_bytes())
    at = data.index(honest)
    data[at + len(honest) - 1] ^= 0xFF  # the last float's last byte: the stored CRC no longer matches
    crc.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"crc\.npz: not a valid \.npz"):
        read_npz(crc, Budget(1 << 20))

    # a million tiny members would cost far more as zipfile's directory objects than as a file: counted first
    many = tmp_path / "many.npz"
    with zipfile.ZipFile(many, "w", zipfile.ZIP_STORED) as z:
        for i in range(1025):
            z.writestr(f"m{i}.npy", b"")
    with pytest.raises(ModelError, match=r"many\.npz: 1025 members \(at most 1024"):
        read_npz(many, Budget(1 << 20))

    # what does fit comes back as numpy wrote it (C and Fortran order)
    for arr in (np.arange(12, dtype=np.int16).reshape(3, 4), np.asfortranarray(np.ones((2, 3)))):
        np.save(tmp_path / "a.npy", arr)
        back = read_npy_file(tmp_path / "a.npy", Budget(1 << 20))
        assert back.dtype == arr.dtype and back.shape == arr.shape and (back == arr).all()


def test_the_default_budget_follows_the_memory_the_process_may_take():
    budget = default_budget()
    assert 0 < budget <= 1 << 30
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < 4 << 30:
        pytest.skip("this process already runs under a small address-space limit")
    out = subprocess.run(
        EXE[:1] + ["-c", "from agent.package.inputbudget import default_budget as d; print(d())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < LIMIT // 4  # a quarter of what is left under the limit, less what it already holds
