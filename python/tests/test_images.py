"""Images decoded in the loader (`decode_images=`): pixels against Pillow, `center` crops
against torchvision, crops and flips that do not depend on threads and resume exactly, and
named errors (or counted skips) for damaged images.

Test images are made here with Pillow from scikit-image's sample photographs (shipped in its
wheel: no download), resized to the sizes each test needs."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

import shardfeed

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")
skdata = pytest.importorskip("skimage.data")


def photo(w: int, h: int, which: int) -> np.ndarray:
    src = [skdata.astronaut, skdata.chelsea, skdata.coffee, skdata.rocket][which % 4]()
    return np.asarray(Image.fromarray(src).resize((w, h), Image.BILINEAR))


def encode(a: np.ndarray, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, fmt, **kw)
    return b.getvalue()


def exif(orientation: int) -> bytes:
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def png16(a: np.ndarray) -> bytes:
    """A 16-bit RGB PNG (Pillow writes none)."""
    h, w, _ = a.shape
    raw = b"".join(b"\0" + a[y].astype(">u2").tobytes() for y in range(h))

    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))

    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def variants(w: int, h: int) -> dict[str, bytes]:
    """Every kind of file the loader must read, all showing `w x h` pixels."""
    out: dict[str, bytes] = {}
    k = 0
    for sub in (0, 1, 2):  # 4:4:4, 4:2:2, 4:2:0
        for prog in (False, True):
            out[f"s{sub}p{int(prog)}.jpg"] = encode(photo(w, h, k), "JPEG", quality=90,
                                                    subsampling=sub, progressive=prog)
            k += 1
    out["gray.jpg"] = encode(np.asarray(Image.fromarray(photo(w, h, 1)).convert("L")), "JPEG", quality=90)
    b = io.BytesIO()
    Image.fromarray(photo(w, h, 2)).convert("CMYK").save(b, "JPEG", quality=90)
    out["cmyk.jpg"] = b.getvalue()
    for o in range(2, 9):
        sw, sh = (h, w) if o >= 5 else (w, h)
        out[f"orient{o}.jpg"] = encode(photo(sw, sh, o), "JPEG", quality=90, exif=exif(o))
    a = photo(w, h, 3)
    for mode in ("RGB", "RGBA", "L", "LA", "P"):
        im = Image.fromarray(a)
        if mode == "RGBA":
            im = im.copy()
            im.putalpha(Image.fromarray((np.arange(w * h) % 256).astype(np.uint8).reshape(h, w)))
        elif mode == "P":
            im = im.convert("P", palette=Image.ADAPTIVE, colors=100)
        else:
            im = im.convert(mode)
        b = io.BytesIO()
        im.save(b, "PNG")
        out[f"png_{mode}.png"] = b.getvalue()
    a16 = photo(w, h, 0).astype(np.uint16) * 257 + 3
    b = io.BytesIO()
    Image.fromarray(a16[..., 0].copy()).save(b, "PNG")
    out["png_gray16.png"] = b.getvalue()
    out["png_rgb16.png"] = png16(a16)
    for o in (3, 6):
        sw, sh = (h, w) if o >= 5 else (w, h)
        out[f"png_orient{o}.png"] = encode(photo(sw, sh, o), "PNG", exif=exif(o))
        out[f"webp_orient{o}.webp"] = encode(photo(sw, sh, o), "WEBP", lossless=True, exif=exif(o))
    out["lossless.webp"] = encode(a, "WEBP", lossless=True)
    out["lossy.webp"] = encode(a, "WEBP", quality=90)
    return out


def folder(root: Path, files: dict[str, bytes], classes: int = 1) -> Path:
    for i, (name, data) in enumerate(sorted(files.items())):
        d = root / "raw" / f"c{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
    return root / "raw"


def reference(data: bytes) -> np.ndarray:
    """Pillow's RGB decode with EXIF orientation applied (16-bit: the high byte)."""
    im = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    if im.mode.startswith("I;16"):
        g = (np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8)
        return np.stack([g] * 3, -1)
    return np.asarray(im.convert("RGB"))


def paths_and_pixels(loader, column="bytes"):
    for batch in loader:
        yield from zip(shardfeed.strings(batch, "path"), batch[column])


@pytest.mark.parametrize("size", [(160, 240), (97, 131), (333, 500)])
def test_pixels_match_pillow(tmp_path, size):
    h, w = size
    files = variants(w, h)
    raw = folder(tmp_path, files)
    shardfeed.shard(str(raw), str(tmp_path / "ds"), shuffle=False)
    loader = shardfeed.Loader(str(tmp_path / "ds"), batch_size=4, columns=["path", "bytes"],
                              shuffle=False, drop_last=False, decode_images="bytes",
                              crop="resize", image_size=(h, w))
    seen = {}
    for path, got in paths_and_pixels(loader):
        name = path.split("/")[-1]
        want = reference(files[name])
        assert got.shape == want.shape == (h, w, 3), name
        diff = np.abs(got.astype(int) - want.astype(int))
        if name.endswith(".png") or name == "lossless.webp" or name.startswith("webp_orient"):
            assert diff.max() == 0, f"{name}: max diff {diff.max()}"
        else:
            # IDCT and chroma upsampling differ between decoders.
            assert np.mean(diff <= 2) >= 0.995, f"{name}: {np.mean(diff <= 2):.4f} within 2"
        seen[name] = True
    assert sorted(seen) == sorted(files)

    # Channels first is the same pixels, transposed.
    first = shardfeed.Loader(str(tmp_path / "ds"), batch_size=4, columns=["path", "bytes"],
                             shuffle=False, drop_last=False, decode_images="bytes",
                             crop="resize", image_size=(h, w), channels_first=True)
    last = shardfeed.Loader(str(tmp_path / "ds"), batch_size=4, columns=["path", "bytes"],
                            shuffle=False, drop_last=False, decode_images="bytes",
                            crop="resize", image_size=(h, w))
    for a, b in zip(first, last):
        assert a["bytes"].shape[1] == 3
        np.testing.assert_array_equal(a["bytes"], b["bytes"].transpose(0, 3, 1, 2))


def test_center_crop_is_close_to_torchvision(tmp_path):
    T = pytest.importorskip("torchvision.transforms")
    sizes = [(500, 375), (375, 500), (300, 300), (640, 427), (231, 157), (224, 224), (180, 400)]
    files = {f"i{i}.jpg": encode(photo(w, h, i), "JPEG", quality=90) for i, (w, h) in enumerate(sizes)}
    raw = folder(tmp_path, files)
    shardfeed.shard(str(raw), str(tmp_path / "ds"), shuffle=False)
    loader = shardfeed.Loader(str(tmp_path / "ds"), batch_size=3, columns=["path", "bytes"],
                              shuffle=False, drop_last=False, decode_images="bytes",
                              crop="center", image_size=224)
    tv = T.Compose([T.Resize(224), T.CenterCrop(224), T.PILToTensor()])
    n = 0
    for path, got in paths_and_pixels(loader):
        want = tv(Image.open(io.BytesIO(files[path.split("/")[-1]])).convert("RGB"))
        diff = np.abs(got.astype(int) - want.permute(1, 2, 0).numpy().astype(int))
        # Documented in docs/IMAGES.md: a mean difference under 0.5 (measured 0.1-0.3:
        # the JPEG decoders' IDCT, and one resize pass instead of resize then crop).
        assert diff.mean() < 0.5, f"{path}: mean diff {diff.mean():.3f}"
        n += 1
    assert n == len(files)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    files = {}
    for i in range(96):
        w, h = 80 + (i * 7) % 60, 60 + (i * 11) % 50
        files[f"p{i:03d}.jpg"] = encode(photo(w, h, i), "JPEG", quality=85)
    raw = folder(root, files, classes=4)
    shardfeed.shard(str(raw), str(root / "ds"), row_group_rows=8)
    return root / "ds", files


def batches(ds, **kw):
    args = dict(batch_size=8, columns=["path", "bytes", "label_index"], decode_images="bytes",
                image_size=48, crop="random_resized", flip=True, seed=5)
    args.update(kw)
    return shardfeed.Loader(str(ds), **args)


def test_random_crops_are_the_same_with_any_thread_count_and_after_resume(photos):
    ds, files = photos
    one = [{k: v.copy() for k, v in b.items()} for b in batches(ds, threads=1)]
    four = [{k: v.copy() for k, v in b.items()} for b in batches(ds, threads=4)]
    assert len(one) == len(four) == len(files) // 8
    for a, b in zip(one, four):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    # Every row once, crops differ from row to row.
    names = [p for p, _ in paths_and_pixels(batches(ds, threads=2))]
    assert sorted(names) == sorted(f"c{i % 4}/{n}" for i, n in enumerate(sorted(files)))

    # Exact resume after 5 batches, in a new loader.
    loader = batches(ds, threads=2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    resumed = batches(ds, threads=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(one) - 5
    for a, b in zip(one[5:], rest):
        np.testing.assert_array_equal(a["bytes"], b["bytes"])

    # Another epoch crops the same rows differently.
    later = batches(ds, threads=2, epoch=1)
    by_path = dict(paths_and_pixels(batches(ds, threads=2)))
    other = dict(paths_and_pixels(later))
    same = sum(np.array_equal(by_path[p], other[p]) for p in by_path)
    assert same <= 2, f"{same} of {len(by_path)} rows cropped alike in epochs 0 and 1"


def test_damaged_images_are_named_or_skipped_and_counted(tmp_path):
    a = photo(120, 90, 1)
    good = {f"good{i}.jpg": encode(photo(120, 90, i), "JPEG", quality=90) for i in range(6)}
    jpeg = encode(a, "JPEG", quality=90)
    prog = encode(a, "JPEG", quality=90, progressive=True)
    png = encode(a, "PNG")
    bad = {
        "truncated.jpg": jpeg[: len(jpeg) // 2],
        "truncated_progressive.jpg": prog[: len(prog) // 2],
        "truncated.png": png[: len(png) // 2],
        "zero.jpg": b"",
        "garbage.jpg": bytes(range(256)) * 8,
    }
    raw = folder(tmp_path, {**good, **bad})
    shardfeed.shard(str(raw), str(tmp_path / "ds"), shuffle=False)
    ds = str(tmp_path / "ds")

    with pytest.raises(shardfeed.ShardfeedError) as e:
        for _ in shardfeed.Loader(ds, batch_size=2, decode_images="bytes", drop_last=False):
            pass
    msg = str(e.value)
    assert "image in column `bytes` of shard shards/part-000000.parquet row group 0 row" in msg, msg

    loader = shardfeed.Loader(ds, batch_size=2, decode_images="bytes", drop_last=False,
                              columns=["path", "bytes"], on_error="skip")
    names = sorted(p.split("/")[-1] for p, _ in paths_and_pixels(loader))
    assert names == sorted(good)
    skipped = loader.stats()["skipped_images"]
    assert len(skipped) == len(bad)
    assert {s["column"] for s in skipped} == {"bytes"}
    errors = " | ".join(s["error"] for s in skipped)
    assert "zero bytes" in errors and "not a JPEG, PNG or WebP" in errors, errors
    assert errors.count("JPEG:") == 2 and "PNG:" in errors, errors

    # `inspect(images=True)` reads the headers only: truncated files still show their format.
    summary = shardfeed.inspect(ds, images=True)["images"]
    assert [c["column"] for c in summary] == ["bytes"]
    assert summary[0]["rows_read"] == len(good) + len(bad)
    assert summary[0]["formats"] == {"jpeg": 8, "png": 1, "unreadable": 2}, summary
    assert (summary[0]["min_width"], summary[0]["max_height"]) == (120, 90)

    # More than max_skipped damaged images: an error.
    with pytest.raises(shardfeed.ShardfeedError, match="max_skipped"):
        for _ in shardfeed.Loader(ds, batch_size=2, decode_images="bytes", drop_last=False,
                                  on_error="skip", max_skipped=2):
            pass


def test_image_options_are_checked(tmp_path):
    raw = folder(tmp_path, {"a.png": encode(photo(40, 30, 0), "PNG")})
    shardfeed.shard(str(raw), str(tmp_path / "ds"))
    ds = str(tmp_path / "ds")
    for kw, option in [
        (dict(decode_images="path"), "decode_images"),
        (dict(decode_images="nope"), "decode_images"),
        (dict(decode_images="bytes", crop="squash"), "crop"),
        (dict(decode_images="bytes", scale=(0.5, 0.1)), "scale"),
        (dict(decode_images="bytes", image_size=0), "image_size"),
        (dict(flip=True), "decode_images"),
    ]:
        with pytest.raises(ValueError, match=option):
            shardfeed.Loader(ds, batch_size=1, drop_last=False, **kw)
    # A pixel limit below the image's size: refused by name, nothing allocated for it.
    with pytest.raises(shardfeed.ShardfeedError, match="max_image_pixels"):
        list(shardfeed.Loader(ds, batch_size=1, drop_last=False, decode_images="bytes",
                              max_image_pixels=1000))


def test_a_10000_by_10000_jpeg_is_refused_from_its_header(tmp_path):
    """A JPEG whose frame header claims 10,000 x 10,000 pixels (100 million, over the default
    limit of 40 million) is refused by name before its pixels are allocated."""
    jpeg = bytearray(encode(photo(40, 30, 0), "JPEG", quality=90))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5:sof + 9] = (10_000).to_bytes(2, "big") + (10_000).to_bytes(2, "big")
    raw = folder(tmp_path, {"huge.jpg": bytes(jpeg), "ok.jpg": encode(photo(40, 30, 1), "JPEG")})
    shardfeed.shard(str(raw), str(tmp_path / "ds"), shuffle=False)
    with pytest.raises(shardfeed.ShardfeedError,
                       match=r"10000x10000 image is larger than max_image_pixels \(40000000\)"):
        list(shardfeed.Loader(str(tmp_path / "ds"), batch_size=2, drop_last=False,
                              decode_images="bytes"))


def test_a_mixture_of_image_datasets_decodes_every_source(tmp_path):
    a = folder(tmp_path / "a", {f"a{i}.jpg": encode(photo(64, 48, i), "JPEG") for i in range(12)})
    b = folder(tmp_path / "b", {f"b{i}.png": encode(photo(40, 50, i), "PNG") for i in range(12)})
    shardfeed.shard(str(a), str(tmp_path / "da"))
    shardfeed.shard(str(b), str(tmp_path / "db"))
    loader = shardfeed.Loader({str(tmp_path / "da"): 0.5, str(tmp_path / "db"): 0.5}, batch_size=4,
                              columns=["bytes"], decode_images="bytes", image_size=(24, 32),
                              drop_last=False)
    counts = [0, 0]
    for batch in loader:
        assert batch["bytes"].dtype == np.uint8 and batch["bytes"].shape[1:] == (24, 32, 3)
        for s in batch["source"]:
            counts[int(s)] += 1
    # Blended 1:1 until the first source runs out (mix_stop="first_exhausted").
    assert max(counts) == 12 and min(counts) >= 11, counts


def test_mutated_images_are_decoded_or_skipped_never_a_crash(tmp_path):
    """Bytes flipped at random in JPEG, PNG and WebP files: each row is either decoded (to the
    right shape) or skipped by name; the loader neither crashes nor stops early."""
    rng = np.random.default_rng(7)
    originals = [encode(photo(64, 48, 0), "JPEG", quality=90),
                 encode(photo(64, 48, 1), "JPEG", quality=90, progressive=True),
                 encode(photo(64, 48, 2), "PNG"), encode(photo(64, 48, 3), "WEBP", quality=80)]
    files = {}
    for i in range(120):
        data = bytearray(originals[i % 4])
        for _ in range(1 + i % 5):
            at = int(rng.integers(2, len(data)))
            data[at] = int(rng.integers(0, 256))
        files[f"m{i:03d}.{['jpg', 'jpg', 'png', 'webp'][i % 4]}"] = bytes(data)
    raw = folder(tmp_path, files)
    shardfeed.shard(str(raw), str(tmp_path / "ds"), shuffle=False)
    loader = shardfeed.Loader(str(tmp_path / "ds"), batch_size=16, columns=["path", "bytes"],
                              decode_images="bytes", image_size=32, drop_last=False,
                              on_error="skip", max_skipped=1000, threads=2)
    decoded = [p for p, px in paths_and_pixels(loader) if px.shape == (32, 32, 3)]
    skipped = loader.stats()["skipped_images"]
    assert len(decoded) + len(skipped) == len(files), (len(decoded), len(skipped))
    assert len(set(decoded)) == len(decoded)


def test_the_torch_example_trains_on_decoded_batches_whatever_the_thread_count(photos):
    """python/examples/torch_images.py: decoded uint8 batches feed a model through
    `shardfeed.torch`; with the same seeds the losses are identical with 1 and 3 loader threads
    (the crops and flips do not depend on threads), and the state after 14 steps of 12-batch
    epochs is in epoch 1."""
    import sys
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from torch_images import train

    ds, _ = photos
    runs = []
    for threads in (1, 3):
        torch.manual_seed(0)
        losses, state = train(str(ds), steps=14, batch_size=8, image_size=32, threads=threads,
                              classes=4)
        runs.append(losses)
        assert len(losses) == 14 and all(np.isfinite(losses))
        assert state["epoch"] == 1, state
    assert runs[0] == runs[1]
