"""The web dashboard in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by selenium) against a real server with its scheduler, real launchers and the fake NVML
seam (every GPU a launcher samples reads 73% busy).

The cluster: node-a (4 whole GPUs), node-s (4 shared GPUs), node-m (2 MIG slices): 10 heatmap
cells. Runs: in p a 4-GPU run holds p's whole quota, so p's other runs wait (quota); in q a
half GPU on node-s and a MIG slice run, and an 8-GPU run waits (quota), which p's people must
not see.

Screenshots of every page go to ``tests/artifacts/dashboard/`` (``MLOPS_GPU_ARTIFACTS`` to move
them); the test prints where. Skips without chromium, chromedriver or selenium, unless
``MLOPS_GPU_REQUIRE_CHROMIUM=1`` (CI) makes that a failure."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from team.conftest import Server, no_5xx

REPO = Path(__file__).resolve().parents[2]
NODES = [
    {"name": "node-a", "gpu_type": "a100-80gb", "gpus": 4},
    {"name": "node-s", "gpu_type": "a100-80gb", "gpus": 4, "shared": True,
     "gpu_memory_mb": 81920},
    {"name": "node-m", "gpu_type": "a100-80gb", "mig": {"3g.40gb": ["MIG-0", "MIG-1"]}},
]  # fmt: skip
CELLS = 4 + 4 + 2
HOSTILE = "<script>alert('pwned')</script>\"'"
BIG = 'pretrain-7b <b>"bold"</b>'  # shown in a title attribute: quotes and tags as text


def _chromium() -> tuple[str, str]:
    need = os.environ.get("MLOPS_GPU_REQUIRE_CHROMIUM") == "1"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        browser = None
    if browser is None or driver is None:
        msg = "needs chromium, chromium-driver and selenium (apt-get install chromium " \
              "chromium-driver; pip install selenium)"  # fmt: skip
        if need:
            pytest.fail(msg + " (MLOPS_GPU_REQUIRE_CHROMIUM=1)")
        pytest.skip(msg)
    return browser, driver


def artifacts() -> Path:
    d = Path(os.environ.get("MLOPS_GPU_ARTIFACTS") or REPO / "tests" / "artifacts") / "dashboard"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, chromedriver = _chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1500,1000"):  # fmt: skip
        opts.add_argument(arg)
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    d.set_page_load_timeout(60)
    yield d
    d.quit()


def api(srv: Server, who: str, method: str, path: str, **kw: Any) -> Any:
    with srv.client(who) as c:
        r = c.request(method, "/api/v1" + path, **kw)
        assert r.status_code < 300, r.text
        return r.json()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """The server, and the run ids by role in the story (see the module's docstring)."""
    _chromium()
    from team.conftest import USERS, add_users, start_server, stop_server, team_config

    d = tmp_path_factory.mktemp("dash-browser")
    cfg = d / "mlops-gpu.yaml"
    data = yaml.safe_load(team_config("sqlite:///state.db"))
    data["backends"]["local"]["nodes"] = NODES
    data["telemetry"] = {"interval_s": 0.5}
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    tokens = add_users(cfg, USERS)
    env = {"MLOPS_GPU_NVML": "mlops_gpu.testing.fake_nvml:from_env", "MLOPS_GPU_FAKE_UTIL": "73",
           "HOME": str(d / "home")}  # fmt: skip
    srv = start_server(cfg, env=env)
    srv.tokens = tokens
    ids = {}
    try:
        ids["big"] = sub(srv, "mara", "p", BIG, gpus=4)
        _settle(srv, {ids["big"]}, set(), {ids["big"]})
        ids["hostile"] = sub(srv, "mara", "p", HOSTILE, gpus=2)
        ids["mine"] = sub(srv, "mem", "p", "mem-finetune", gpus=1)
        ids["half"] = sub(srv, "qm", "q", "q-notebook", gpu_fraction=0.5)
        ids["mig"] = sub(srv, "qm", "q", "q-mig", mig="3g.40gb")
        ids["q_wait"] = sub(srv, "qm", "q", "q-waits", gpus=4)
        _settle(srv, {ids["big"], ids["half"], ids["mig"]},
                {ids["hostile"], ids["mine"], ids["q_wait"]}, {ids["big"]})  # fmt: skip
        yield srv, ids
    finally:
        stop_server(srv)


def sub(srv: Server, who: str, project: str, name: str, **request: Any) -> str:
    body = {"project": project, "command": ["sleep", "600"], "name": name, **request}
    return str(api(srv, who, "POST", "/runs", json=body)["id"])


def _settle(srv: Server, running: set[str], pending: set[str], big: set[str]) -> None:
    """Until the runs in ``running`` run and the runs in ``pending`` wait with a reason, and
    the runs in ``big`` have utilization samples."""
    deadline = time.monotonic() + 120
    while True:
        queue = {r["id"]: r for r in api(srv, "root", "GET", "/queue")}
        phases = {i: api(srv, "root", "GET", f"/runs/{i}")["phase"] for i in running}
        store = srv.store()
        try:
            from mlops_gpu.state import observed

            sampled = {s.run_id for s in observed.read(store).samples}
        finally:
            store.close()
        # (the launcher samples whole GPUs; a MIG slice or a GPU share may not be sampled)
        ok = all(p == "running" for p in phases.values()) and big <= sampled
        ok = ok and all(i in queue and queue[i]["reason_code"] for i in pending)
        if ok:
            return
        assert time.monotonic() < deadline, (phases, queue, sampled, srv.log.read_text()[-3000:])
        time.sleep(0.5)


def login(d: Any, srv: Server, who: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d.delete_all_cookies()
    d.get(srv.url + "/")
    assert d.current_url.endswith("/login")
    d.find_element(By.ID, "token").send_keys(srv.tokens[who])
    d.find_element(By.CSS_SELECTOR, "#login button").click()
    # (the click returns before the next page has loaded)
    WebDriverWait(d, 30).until(lambda d: d.find_elements(By.ID, "who"))
    assert d.find_element(By.ID, "who").text.startswith(who)


def shot(d: Any, name: str) -> Path:
    path = artifacts() / f"{name}.png"
    d.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def test_dashboard_in_chromium(driver: Any, cluster: tuple[Server, dict[str, str]]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    srv, ids = cluster
    d = driver
    # the login page refuses a wrong token with one line
    d.delete_all_cookies()
    d.get(srv.url + "/cluster")
    assert d.current_url.endswith("/login")
    d.find_element(By.ID, "token").send_keys("mgt_wrong")
    d.find_element(By.CSS_SELECTOR, "#login button").click()
    WebDriverWait(d, 30).until(lambda d: d.find_elements(By.ID, "login-error"))
    assert "invalid, expired or revoked token" in d.find_element(By.ID, "login-error").text
    shot(d, "0-login")

    login(d, srv, "mara")  # maintainer of p
    d.get_log("browser")  # (drained: the wrong token's 401 above is logged as an error)
    # Queue: every pending run mara may see, each with the reason the API gives
    expected = {r["id"]: r for r in api(srv, "mara", "GET", "/queue")}
    assert set(expected) == {ids["hostile"], ids["mine"]}
    rows = {tr.get_attribute("data-run"): tr
            for tr in d.find_elements(By.CSS_SELECTOR, "#queue tbody tr")}  # fmt: skip
    assert set(rows) == set(expected)
    for rid, run in expected.items():
        cell = rows[rid].find_element(By.CSS_SELECTOR, "td.reason").text
        assert run["reason_code"] in cell and run["reason"] in cell, (cell, run)
    assert ids["q_wait"] not in d.page_source  # q's run: not mara's to see
    # a hostile name is shown as text: no script ran (no alert), the text is intact
    name = rows[ids["hostile"]].find_element(By.CSS_SELECTOR, ".name").text
    assert name == HOSTILE
    assert d.find_element(By.ID, "pending-total").text == "2"
    assert "quota" in d.find_element(By.ID, "reasons").text
    shot(d, "1-queue")
    # the filter form, as a user fills it in: mem's runs only
    d.find_element(By.CSS_SELECTOR, '#filters input[name="user"]').send_keys("mem")
    d.find_element(By.CSS_SELECTOR, "#filters button").click()
    WebDriverWait(d, 30).until(lambda d: "user=mem" in d.current_url)
    rows = [
        tr.get_attribute("data-run") for tr in d.find_elements(By.CSS_SELECTOR, "#queue tbody tr")
    ]
    assert rows == [ids["mine"]]

    # Cluster: one cell per GPU and MIG slice; held cells name their runs (q's: hidden)
    d.get(srv.url + "/cluster")
    cells = d.find_elements(By.CSS_SELECTOR, "#heatmap .g")
    assert len(cells) == CELLS
    assert d.find_element(By.ID, "gpu-total").text == str(CELLS)
    titles = [c.get_attribute("title") for c in cells]
    classes = [c.get_attribute("class") for c in cells]
    big = [t for t in titles if ids["big"] in t]
    assert len(big) == 4 and all("73% busy" in t and BIG in t for t in big), big
    assert not d.find_elements(By.CSS_SELECTOR, "#heatmap b")
    assert sum("u7" in c for c in classes) >= 4  # 73%: the 70-80% colour
    assert sum(" mig " in f" {c} " for c in classes) == 2
    assert any("shared" in c and "allocated" in c for c in classes)  # q's half GPU
    assert not any(ids["half"] in t or ids["mig"] in t for t in titles)
    assert sum("a run of another project" in t for t in titles) == 2
    shot(d, "2-cluster")
    # the page refreshes itself in place (fetch of the page under the CSP, <main> swapped in)
    first = d.find_element(By.ID, "refreshed").text
    WebDriverWait(d, 30).until(lambda d: d.find_element(By.ID, "refreshed").text != first)
    assert len(d.find_elements(By.CSS_SELECTOR, "#heatmap .g")) == CELLS
    errors = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors  # no CSP violation, no failed request

    # Runs, Projects, Costs
    d.get(srv.url + "/runs")
    phases = {tr.get_attribute("data-run"): tr.find_element(By.CSS_SELECTOR, ".phase").text
              for tr in d.find_elements(By.CSS_SELECTOR, "#runs tbody tr")}  # fmt: skip
    assert phases[ids["big"]] == "running" and phases[ids["mine"]] == "pending"
    assert ids["half"] not in phases
    shot(d, "3-runs")
    d.get(srv.url + "/projects")
    assert [tr.get_attribute("data-project")
            for tr in d.find_elements(By.CSS_SELECTOR, "#projects tbody tr")] == ["p"]  # fmt: skip
    assert "4.00" in d.find_element(By.ID, "projects").text  # p uses its 4 GPUs
    cells = [td.text for td in d.find_elements(By.CSS_SELECTOR, "#projects tbody tr td")]
    assert cells[-2:] == ["2", "1"]  # pending: hostile and mine; running: big
    shot(d, "4-projects")
    d.get(srv.url + "/costs")
    assert d.find_element(By.ID, "cost-running").text.count("p") >= 1
    cells = [td.text for td in d.find_elements(By.CSS_SELECTOR, "#cost-running tbody tr td")]
    assert cells[:2] == ["p", "1"]  # big, the one run of p holding GPUs now
    shot(d, "5-costs")

    # cancel mem's pending run as the maintainer, and see it leave the queue
    d.get(srv.url + "/")
    d.find_element(By.CSS_SELECTOR, f'button.cancel[data-run="{ids["mine"]}"]').click()
    WebDriverWait(d, 10).until(ec.alert_is_present()).accept()
    WebDriverWait(d, 20).until(
        lambda d: ids["mine"] not in {tr.get_attribute("data-run")
                                      for tr in d.find_elements(By.CSS_SELECTOR, "#queue tr")}
    )  # fmt: skip
    assert d.find_element(By.ID, "pending-total").text == "1"
    assert api(srv, "root", "GET", f"/runs/{ids['mine']}")["phase"] == "cancelled"
    d.get(srv.url + "/runs")
    row = d.find_element(By.CSS_SELECTOR, f'#runs tr[data-run="{ids["mine"]}"]')
    assert row.find_element(By.CSS_SELECTOR, ".phase").text == "cancelled"
    assert not row.find_elements(By.CSS_SELECTOR, "button.cancel")  # nothing left to cancel
    shot(d, "6-runs-after-cancel")

    # the viewer of p: the same runs, no cancel control anywhere
    login(d, srv, "vic")
    assert ids["hostile"] in d.page_source
    assert not d.find_elements(By.CSS_SELECTOR, "button.cancel")
    shot(d, "7-queue-viewer")
    d.get(srv.url + "/runs")
    assert ids["big"] in d.page_source
    assert not d.find_elements(By.CSS_SELECTOR, "button.cancel")
    # and the API refuses the viewer's cancel anyway
    with srv.client("vic") as c:
        assert c.post(f"/api/v1/runs/{ids['hostile']}/cancel").status_code == 403
    d.find_element(By.ID, "logout").click()
    WebDriverWait(d, 30).until(lambda d: d.current_url.endswith("/login"))
    no_5xx(srv)
