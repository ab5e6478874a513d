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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

from fear_assets_tests.browser_ui import INSTANCE_YAML, WORKSPACE_YAML, free_port, start_ui, stop_ui  # noqa: E402

OUT = ROOT / "docs" / "ui_asset_graph.png"
# Assets of three different groups: all three are drawn only when every group is expanded.
EXPECTED = ("frame_bank", "registration_record", "section8_reading")


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
                "--window-size=1600,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(shutil.which("chromedriver")), options=options)
    # The window's frame takes part of --window-size: fix the page itself at 1600x1000.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1600, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    try:
        base = f"http://127.0.0.1:{port}"
        driver.get(f"{base}/assets")
        skip = _until(lambda: driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"), 60,
                      "the first-visit dialog appeared")
        skip[0].click()
        driver.get(f"{base}/asset-groups")
        _until(lambda: "stimuli" in driver.find_element(By.TAG_NAME, "body").text, 120, "the lineage shows its groups")
        time.sleep(3)
        # More room for the graph: hide the navigation and the group list.
        for label in ("Hide navigation",):
            for element in driver.find_elements(By.XPATH, f"//*[normalize-space(text())={label!r}]"):
                element.click()
        lists = driver.find_elements(By.XPATH, "//input[starts-with(@placeholder, 'Jump to')]/following::button[1]")
        if lists:
            lists[0].click()
        time.sleep(2)
        # "Expand all groups" is an item of the graph's settings menu (a button at the right
        # edge): open each right-edge button until the item shows, then click it.
        drawn = lambda: all(key in driver.page_source for key in EXPECTED)  # noqa: E731
        width = driver.execute_script("return window.innerWidth")
        for button in driver.find_elements(By.TAG_NAME, "button"):
            if not button.is_displayed() or button.location["x"] < 0.9 * width:
                continue
            button.click()
            time.sleep(1)
            items = [e for e in driver.find_elements(By.XPATH, "//*[normalize-space(text())='Expand all groups']")
                     if e.is_displayed()]
            if items:
                items[0].click()
                break
            ActionChains(driver).send_keys(Keys.ESCAPE).perform()
        _until(drawn, 30, f"every group expanded ({', '.join(EXPECTED)} drawn)")
        time.sleep(5)  # let the expanded graph lay out and fit the view
        driver.save_screenshot(str(home / "asset_graph.png"))
        shutil.copy(home / "asset_graph.png", OUT)
        print(f"wrote {OUT}")
    finally:
        driver.quit()
        stop_ui(proc)


if __name__ == "__main__":
    main()
