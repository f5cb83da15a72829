"""``coordinator serve --console``: the read-only web page of a real coordinator process (TLS on
loopback, so the console speaks HTTPS with the coordinator's certificate). It refuses every page
without the operator token (401 with the login form; 403 for a wrong token; a token in the URL
is not read), escapes what it prints (a study named ``<script>alert(1)</script>``, a device
labelled with markup), and headless Chromium, driven by selenium, logs in with the form, reads a
finished study's state and finds the centroids' SVG with k points of the published weights."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
import tempfile
from pathlib import Path

import pytest
from test_round_processes import CoordinatorProcess, cli, create_study, wait_done
from test_round_processes import device_files as device_files  # a module-scoped fixture

pytestmark = pytest.mark.slow
NAME = "<script>alert(1)</script>"
LABEL = '<img src=x onerror="alert(2)">'
K = 3  # create_study's k
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Console:
    """The coordinator process with its console, a done study and a study named :data:`NAME`."""

    def __init__(self, folder: Path, certs: Path, data: list[Path]) -> None:
        self.port = free_port()
        self.c = CoordinatorProcess(folder, certs, "--console", f"127.0.0.1:{self.port}")
        self.c.start()
        self.token = self.c.token_file.read_text().strip()
        self.context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        self.done = create_study(self.c, 1)
        token = self.c.op("tokens").stdout.strip()
        cli("device", "run", "--coordinator", self.c.target, "--ca", str(certs / "ca.pem"), "--data",
            str(data[0]), "--ledger", str(folder / "ledger"), "--budget", "10", "--label", LABEL,
            "--once", "--token", token)
        self.result = wait_done(self.c, self.done)
        self.named = self.c.op("create-study", "--name", NAME, "--d", "3", "--k", "3", "--bounds",
                               "-12:12", "--rounds", "0", "--scale", "1.5", "--epsilon", "5", "--m",
                               "60", "--min-devices", "2").stdout.strip()

    def request(self, method: str, path: str, headers: dict | None = None,
                body: str | None = None) -> tuple[int, str, http.client.HTTPMessage]:
        conn = http.client.HTTPSConnection("localhost", self.port, context=self.context, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            res = conn.getresponse()
            return res.status, res.read().decode(), res.headers
        finally:
            conn.close()

    def bearer(self, token: str | None = None) -> dict:
        return {"Authorization": f"Bearer {token or self.token}"}


@pytest.fixture(scope="module")
def console(tmp_path_factory, cli_certs, device_files):
    found = Console(tmp_path_factory.mktemp("console"), cli_certs, device_files)
    yield found
    if found.c.proc.poll() is None:
        assert found.c.terminate() == 0


def test_every_page_refuses_without_the_operator_token(console):
    pages = ("/", f"/study/{console.done}", f"/study/{console.named}")
    for path in pages:
        status, body, headers = console.request("GET", path)
        assert status == 401 and 'name="token"' in body and 'method="post"' in body
        assert console.done not in body and console.named not in body and "alert" not in body
        assert headers["WWW-Authenticate"].startswith("Bearer")
        status, body, _ = console.request("GET", path, console.bearer("not-the-token"))
        assert status == 403 and console.done not in body
        status, body, _ = console.request("GET", f"{path}?token={console.token}")  # never from a URL
        assert status == 401 and console.done not in body
    status, _, headers = console.request("POST", "/login", FORM, "token=not-the-token")
    assert status == 403 and "Set-Cookie" not in headers
    status, body, headers = console.request("GET", "/", console.bearer())
    assert status == 200 and console.done in body
    assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none': no script
    assert headers["Cache-Control"] == "no-store" and headers["X-Frame-Options"] == "DENY"


def test_a_login_opens_a_session_and_a_logout_ends_it(console):
    status, _, headers = console.request("POST", "/login", FORM, f"token={console.token}")
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    for flag in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/"):
        assert flag in cookie
    session = {"Cookie": cookie.split(";")[0]}
    status, body, _ = console.request("GET", f"/study/{console.done}", session)
    assert status == 200 and console.done in body
    assert console.request("POST", "/logout", session, "")[0] == 303
    assert console.request("GET", "/", session)[0] == 401


def test_the_page_escapes_what_it_prints(console):
    for path in ("/", f"/study/{console.named}", f"/study/{console.done}"):
        status, body, _ = console.request("GET", path, console.bearer())
        assert status == 200
        assert "<script" not in body.lower() and "<img" not in body.lower(), path
    _, front, _ = console.request("GET", "/", console.bearer())
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in front
    _, done, _ = console.request("GET", f"/study/{console.done}", console.bearer())
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in done  # the device's label, on its roster
    status, body, _ = console.request("GET", "/study/%3Cb%3Enone%3C%2Fb%3E", console.bearer())
    assert status == 404 and "&lt;b&gt;none&lt;/b&gt;" in body and "<b>" not in body


BROWSER, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.skipif(BROWSER is None or DRIVER is None,
                    reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
def test_headless_chromium_logs_in_and_finds_the_centroids(console):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager downloads nothing
    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.accept_insecure_certs = True  # the test CA is not in Chromium's store
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    try:
        driver.set_page_load_timeout(60)
        driver.get(f"https://localhost:{console.port}/")
        assert driver.find_elements(By.ID, "studies") == []  # the login form, not the studies
        driver.find_element(By.ID, "token").send_keys(console.token)
        driver.find_element(By.ID, "login").click()
        # a click returns before the next page loads: wait for it (60 s, for a loaded machine;
        # the find failed once at once under load)
        wait = WebDriverWait(driver, 60)
        rows = wait.until(lambda d: d.find_element(By.ID, "studies")).find_elements(By.TAG_NAME, "tr")
        (row,) = [r for r in rows if console.done in r.text]
        assert row.find_elements(By.TAG_NAME, "td")[2].text == "DONE"
        assert console.token not in driver.current_url
        row.find_element(By.LINK_TEXT, console.done).click()
        assert wait.until(lambda d: d.find_element(By.ID, "identifiability")).text == (
            console.result["identifiability"]["status"])
        assert driver.find_element(By.ID, "verdict").text == console.result["verdict"]["status"]
        svg = driver.find_element(By.ID, "centroids")
        points = svg.find_elements(By.CSS_SELECTOR, "circle.centroid")
        assert len(points) == K
        weights = sorted(float(p.get_attribute("data-weight")) for p in points)
        assert weights == pytest.approx(sorted(console.result["weights"]), rel=1e-5)
        facts = driver.find_element(By.ID, "facts").text
        assert "DONE" in facts and "1 / 1 / 1" in facts
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_a_stalled_connection_does_not_hold_up_the_console(console):
    """A client that connects and never starts its TLS handshake holds only its own thread."""
    with socket.create_connection(("127.0.0.1", console.port), timeout=30):
        status, body, _ = console.request("GET", "/login")
        assert status == 200 and 'name="token"' in body
