"""Refresh the README's screenshot, docs/ui_asset_graph.png: the global asset lineage with
every group expanded, taken from ``dagster dev`` on loopback over an empty instance (the
graph needs no materialisation) through Debian's headless chromium (Selenium).

Run once by hand, from the project root: ``.venv/bin/python scripts/ui_screenshot.py``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from fear_assets_tests.browser_ui import INSTANCE_YAML, WORKSPACE_YAML, free_port, start_ui, stop_ui  # noqa: E402

OUT = ROOT / "docs" / "ui_asset_graph.png"
# Tall enough that the lineage, fitted to the width, shows every stage.
WIDTH, HEIGHT = 1600, 1500
# Assets of three different groups: all three are drawn only when every group is expanded
# (short keys: a node shows a long key shortened in the middle).
EXPECTED = ("frame_bank", "power_summary", "section8_reading")
STAGES = ("stimuli", "pilot", "registration", "collection", "probes", "analysis", "reading")
# The viewport's zoom-out button (its icon is a div role="img" aria-label="zoom_out").
ZOOM_OUT = "//div[@role='img' and @aria-label='zoom_out']/ancestor::button[1]"


def _until(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise RuntimeError(f"{what} within {timeout:.0f} s")


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="fear_ui_shot_"))
    (home / "dagster.yaml").write_text(INSTANCE_YAML.format(home=home))
    (home / "workspace.yaml").write_text(WORKSPACE_YAML.format(root=ROOT))
    port = free_port()
    proc = start_ui(home, port, home / "dagster_dev.log")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WIDTH},{HEIGHT}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(shutil.which("chromedriver")), options=options)
    # The expanded graph fitted into 1600x1000 is drawn too small for Dagster to render its
    # nodes: lay the page out at twice the size, then scale the picture down.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 2 * WIDTH, "height": 2 * HEIGHT, "deviceScaleFactor": 1, "mobile": False})
    try:
        base = f"http://127.0.0.1:{port}"
        driver.get(f"{base}/assets")
        skip = _until(lambda: driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"), 60,
                      "the first-visit dialog appeared")
        skip[0].click()
        driver.get(f"{base}/asset-groups")
        _until(lambda: "stimuli" in driver.find_element(By.TAG_NAME, "body").text, 120, "the lineage shows its groups")
        # More room for the graph: hide the navigation and the group list (both kept by the UI).
        for element in driver.find_elements(By.XPATH, "//*[normalize-space(text())='Hide navigation']"):
            element.click()
        lists = driver.find_elements(By.XPATH, "//input[starts-with(@placeholder, 'Jump to')]/following::button[1]")
        if lists:
            lists[0].click()
        time.sleep(2)
        # The lineage keeps its expanded groups in the URL (`expanded=<group id>,...`; the id is
        # `global@global:<group>`, or `<repository>@<location>:<group>` with groups per code
        # location): open it with every stage group expanded, both id forms given.
        ids = [f"{prefix}:{group}" for group in STAGES
               for prefix in ("global@global", "__repository__@two_facts_one_gate")]
        driver.get(f"{base}/asset-groups?expanded={urllib.parse.quote(','.join(ids))}")
        # Nodes are drawn only inside the view, and not at all below a zoom level: the view fits
        # the graph's width; zoom out a little (the viewport's own button) if a stage is cut off.
        drawn = lambda: all(key in driver.page_source for key in EXPECTED)  # noqa: E731
        _until(lambda: "frame_bank" in driver.page_source, 120, "the expanded graph is drawn")
        for _ in range(4):
            time.sleep(3)
            if drawn():
                break
            driver.find_element(By.XPATH, ZOOM_OUT).click()
        if not drawn():
            driver.save_screenshot(str(home / "not_expanded.png"))
            raise RuntimeError(f"not every group's assets drawn ({', '.join(EXPECTED)}); see {home / 'not_expanded.png'}")
        # One step out: the fitted view cuts the tallest groups' edges; a step keeps the labels.
        driver.find_element(By.XPATH, ZOOM_OUT).click()
        time.sleep(5)  # let the expanded graph lay out and fit the view
        driver.save_screenshot(str(home / "asset_graph.png"))
        Image.open(home / "asset_graph.png").convert("RGB").resize((WIDTH, HEIGHT), Image.LANCZOS).save(OUT)
        print(f"wrote {OUT}")
    finally:
        driver.quit()
        stop_ui(proc)

if __name__ == "__main__":
    main()
