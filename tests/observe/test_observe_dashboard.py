"""The dashboard in a real browser: headless Chromium loads it from a serving engine.

The page's script must have fetched ``/status`` and drawn it: the rendered DOM (``--dump-dom``
after the page's timers ran, ``--virtual-time-budget``) lists every procedure, stream, window
and sink in dataflow order with live numbers, and the halted procedure in red with its error.
A screenshot is kept as ``tests/artifacts/dashboard.png`` (git-ignored; overwritten by each
run) for a person to look at, and its pixels are checked for the red of a halted node.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

from PIL import Image

from migrators import StreamToPostgres
from sstore import Engine, observe
from tests.observe.test_observe import assert_dataflow_order
from tests.observe_flow import DATAFLOW, INPUTS, declare_flow, feed

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
SINK = "migrator:public.enriched"
HALT_RED = (198, 40, 40)  # --bad in dashboard.html: the stroke of a halted node


def chromium(url: str, profile: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Chromium is needed for this test: apt-get install chromium (.ci/run does)"
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-proxy-server", f"--user-data-dir={profile}",
         "--window-size=1280,900", "--virtual-time-budget=5000", *mode, url],
        capture_output=True, text=True, timeout=120, check=False)


class Nodes(HTMLParser):
    """The SVG nodes the page drew (``<g class="node ..." data-name=...>``), in DOM order,
    with their classes and text; and the rows of the node table."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[dict[str, str]] = []
        self.rows: list[str] = []
        self._inside: dict[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "g" and a.get("class", "").startswith("node "):
            self._inside = {"name": a["data-name"], "class": a["class"], "text": ""}
            self.nodes.append(self._inside)
        elif tag == "tr" and "data-name" in a:
            self.rows.append(a["data-name"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "g":
            self._inside = None

    def handle_data(self, data: str) -> None:
        if self._inside is not None:
            self._inside["text"] += data + " "


def test_the_dashboard_draws_the_live_dataflow_in_chromium(state_path: str, pg_url: str,
                                                           tmp_path: Path) -> None:
    eng = Engine(state_path)
    declare_flow(eng, halt_at=4)
    sink = StreamToPostgres(eng, "k_enriched", pg_url, "public.enriched")
    url = observe.serve(eng, 0)
    sink.attach()
    try:
        feed(eng, 6)
        assert sink.flush(timeout=30)
        dom = chromium(url, tmp_path / "profile", "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-3000:]
        shot = tmp_path / "dashboard.png"
        pic = chromium(url, tmp_path / "profile", f"--screenshot={shot}")
        assert pic.returncode == 0 and shot.exists(), pic.stderr[-3000:]
    finally:
        sink.detach()
        eng.close()

    page = Nodes()
    page.feed(dom.stdout)
    expected = DATAFLOW[:DATAFLOW.index("k_enriched") + 1] + [SINK] + \
        DATAFLOW[DATAFLOW.index("k_enriched") + 1:]
    names = [n["name"] for n in page.nodes]
    assert names == expected, dom.stdout[-3000:]  # every node drawn, in dataflow order
    assert page.rows == expected  # and the table below the graph
    assert_dataflow_order(names, {**INPUTS, SINK: ["k_enriched"]})
    node = {n["name"]: n for n in page.nodes}
    assert "batch 6 · 0 pending" in node["z_parse"]["text"]  # live numbers from /status
    assert "batches/s" in node["a_total"]["text"]
    assert "watermark 6 · lag 0 batches" in node[SINK]["text"]
    assert "batch 6" in node["zz_raw"]["text"] and "rows kept" in node["zz_raw"]["text"]
    assert "halted" in node["y_watch"]["class"].split()
    assert "HALTED" in node["y_watch"]["text"] and "bad batch 4" in node["y_watch"]["text"]
    assert all("halted" not in n["class"].split() for n in page.nodes if n["name"] != "y_watch")
    assert "ValueError: bad batch 4" in dom.stdout  # the errors table

    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "dashboard.png")
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 900)
    red = sum(1 for pixel in image.getdata()
              if all(abs(c - h) <= 12 for c, h in zip(pixel, HALT_RED)))
    assert red > 200, f"no halted-red node drawn ({red} red pixels)"
