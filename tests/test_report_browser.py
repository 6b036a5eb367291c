"""The HTML report renders in a real browser (headless Chromium; issue 5).

Skipped when Chromium is missing, except under CI (environment variable
``CI`` set), where a missing browser is a failure. With
``EMPDP_UPDATE_SCREENSHOT=1`` the test also refreshes ``docs/report-excerpt.png``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from empdp.assessment.assess import assess
from empdp.report import render_report
from empdp.settings import Model

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data" / "countymurders.parquet"
EXCERPT = ROOT / "docs" / "report-excerpt.png"
WIDTH, HEIGHT = 1200, 3000


def _chromium() -> str:
    path = next((p for p in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
                 if p and os.access(p, os.X_OK)), None)
    if path is None:
        message = "headless Chromium not found (/usr/bin/chromium); install Debian's 'chromium' package"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def screenshot(browser: str, html: Path, png: Path, profile: Path, width: int = WIDTH, height: int = HEIGHT) -> None:
    """Render ``html`` in headless Chromium and save a ``width`` × ``height`` screenshot."""
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={width},{height}",
           html.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert png.exists(), f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}"


def test_report_renders_in_chromium(tmp_path, monkeypatch):
    from PIL import Image

    browser = _chromium()
    monkeypatch.chdir(ROOT)  # a relative source path reads better in the README screenshot
    result = assess(str(SAMPLE.relative_to(ROOT)), id="countyid", by="year", query="mean(murdrate)",
                    model=Model(kernel="laplace", bandwidth=0.05))
    html = tmp_path / "report.html"
    render_report(result, html)
    png = tmp_path / "shot.png"
    screenshot(browser, html, png, tmp_path / "profile")

    img = np.asarray(Image.open(png).convert("RGB"))
    assert img.shape == (HEIGHT, WIDTH, 3)
    colours = np.unique(img.reshape(-1, 3), axis=0)
    assert len(colours) > 50, f"screenshot looks blank: {len(colours)} distinct colours"
    non_white = np.any(img < 245, axis=2)
    assert non_white.mean() > 0.05, "screenshot is almost all white"
    # the stylesheet was applied: the header rule and headings use the accent colour #1f4e79
    accent = np.all(np.abs(img.astype(int) - (0x1F, 0x4E, 0x79)) <= 6, axis=2)
    assert accent[:300].sum() > 500, "no accent colour near the top: CSS not applied?"
    # the figures rendered: plenty of ink in the lower part of the page too
    assert non_white[HEIGHT // 2:].mean() > 0.03

    if os.environ.get("EMPDP_UPDATE_SCREENSHOT"):
        excerpt = Image.open(png).convert("RGB").crop((0, 0, WIDTH, 1450))
        excerpt = excerpt.quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        excerpt.save(EXCERPT, optimize=True)
        assert EXCERPT.stat().st_size < 300_000


def test_missing_chromium_fails_under_ci(monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="chromium"):
        _chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="chromium"):
        _chromium()
