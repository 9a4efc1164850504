"""The check every picture test makes: a PNG a person can read at 1,200 pixels wide, with something drawn on it."""

from pathlib import Path

PNG = b"\x89PNG\r\n\x1a\n"
READ_WIDTH = 1200  # pixels: the width the pictures are read at (sharebert/accounting/picture.py draws them 1:1)


def assert_readable_png(path: Path) -> tuple[int, int]:
    """``(width, height)`` of the PNG at ``path``, after checking its header, a width of at least 1,200 pixels and
    that at least 1% of its pixels are ink (darker than light grey): not a blank or all-background image."""
    from PIL import Image

    path = Path(path)
    assert path.read_bytes()[:8] == PNG, f"{path} is not a PNG"
    with Image.open(path) as image:
        width, height = image.size
        grey = image.convert("L")
        ink = sum(count for value, count in enumerate(grey.histogram()) if value < 200)
    assert width >= READ_WIDTH, f"{path} is {width} pixels wide, under {READ_WIDTH}"
    assert ink >= 0.01 * width * height, f"{path}: {ink} of {width * height} pixels drawn: blank"
    return width, height
