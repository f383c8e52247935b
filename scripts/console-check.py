#!/usr/bin/env python3
"""The operators' console in a real browser (Chromium, driven by Selenium), against a live stack
that scripts/console-check.sh started. It plays what support does every day:

- signs in with the admin token;
- finds a failed job by filter, opens it, retries it once its model is fixed, and sees it complete;
- pauses a provider, sees a new job wait queued, resumes, and sees it complete;
- grants a user credits and sees users/me change;
- reads the workers and the audit log;
- signs in as the viewer: no action button anywhere, and a POST sent anyway is refused (403);
- on a phone's screen, the pages fit its width.

It saves a screenshot of each main page in --screenshots. The model is a local HTTP server of
this script's (the stack's JOBS_EFFECTS names it, a `remote` effect): the worker POSTs JSON with
the image's URL (Services/jobs/Worker/EffectRunner.swift, `remote`), and it answers 400 until
fixed, then the image itself.
"""
import argparse
import http.server
import json
import pathlib
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

ROOT = pathlib.Path(__file__).resolve().parent.parent
PHOTO = (ROOT / "Tests/Fixtures/images/photo.jpg").read_bytes()
fixed = threading.Event()


class Model(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if fixed.is_set():
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(PHOTO)))
            self.end_headers()
            self.wfile.write(PHOTO)
        else:
            body = b"the model is broken until fixed"
            self.send_response(400)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--admin-token", required=True)
    parser.add_argument("--viewer-token", required=True)
    parser.add_argument("--model-port", type=int, required=True)
    parser.add_argument("--screenshots", required=True)
    args = parser.parse_args()
    shots = pathlib.Path(args.screenshots)
    shots.mkdir(parents=True, exist_ok=True)
    model = http.server.ThreadingHTTPServer(("127.0.0.1", args.model_port), Model)
    threading.Thread(target=model.serve_forever, daemon=True).start()

    device = str(uuid.uuid4())
    user_id = f"device:{device}"

    def rest(method, path, body=None, headers=None, raw=None, content_type="application/json"):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(args.url + path if path.startswith("/") else path, data=data, method=method)
        for name, value in (headers or {"X-Device-Id": device}).items():
            request.add_header(name, value)
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
                return response.status, (json.loads(text) if text and response.headers.get_content_type() == "application/json" else text)
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    admin_headers = {"Authorization": f"Bearer {args.admin_token}"}

    def wait_for(condition, what, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}")

    def job_status(job_id):
        status, body = rest("GET", f"/api/v1/jobs/{job_id}/status")
        assert status == 200, (status, body)
        return body["status"]

    def create_job():
        status, presign = rest("POST", "/api/v1/uploads/presigned", {"filename": "photo.jpg", "contentType": "image/jpeg"})
        assert status == 200, (status, presign)
        headers = {"Content-Type": "image/jpeg", **presign.get("headers", {})}
        status, _ = rest("PUT", presign["uploadUrl"], raw=PHOTO, headers=headers, content_type="image/jpeg")
        assert status in (200, 201), status
        status, created = rest("POST", "/api/v1/jobs", {"imageKey": presign["imageKey"], "effectId": "fixable", "parameters": {}})
        assert status in (200, 201, 202), (status, created)
        return created["jobId"]

    def remaining_today():
        status, me = rest("GET", "/api/v1/users/me")
        assert status == 200, (status, me)
        return me["quota"]["dailyRemaining"]

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    wait = WebDriverWait(driver, 60, poll_frequency=0.2)
    step = "start"

    def find(selector):
        return driver.find_element(By.CSS_SELECTOR, selector)

    # The queue, providers and workers pages are drawn again every few seconds: an element found
    # may be replaced before it is read or clicked, so both are tried again until they hold.
    def text_of(selector):
        try:
            elements = driver.find_elements(By.CSS_SELECTOR, selector)
            return elements[0].text if elements else None
        except StaleElementReferenceException:
            return None

    def click(selector):
        def clicked(d):
            try:
                d.find_element(By.CSS_SELECTOR, selector).click()
                return True
            except StaleElementReferenceException:
                return False
        wait.until(clicked)

    def go(hash_, selector):
        driver.get(f"{args.url}/admin{hash_}")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, selector))

    def confirm():
        wait.until(lambda d: d.find_element(By.ID, "confirm-dialog").get_attribute("open") is not None)
        click("#confirm-yes")

    def shot(name):
        driver.save_screenshot(str(shots / f"{name}.png"))

    def sign_in(token, role):
        driver.get(f"{args.url}/admin")
        wait.until(lambda d: d.find_elements(By.ID, "token"))
        find("#token").send_keys(token)
        click("#login-button")
        wait.until(lambda d: text_of("#role") == role)

    try:
        step = "a job fails at its model"
        failed = create_job()
        wait_for(lambda: job_status(failed) == "failed", "the job to fail")

        step = "sign in as the admin"
        sign_in(args.admin_token, "admin")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#effects-table tr[data-effect='fixable']"))
        wait.until(lambda d: text_of("#count-failed") and text_of("#count-failed").startswith("1"))
        shot("queue")
        print("console-check: signed in; the queue shows the failed job")

        step = "find the failed job by filter and retry it"
        go("#/jobs", "#filters")
        Select(find("#filter-state")).select_by_value("failed")
        find("#filter-effect").send_keys("fixable")
        find("#filter-error").send_keys("400")
        click("#filter-apply")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#jobs-table tr[data-job-id='{failed}']"))
        assert len(driver.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")) == 1
        shot("jobs")
        click(f"#jobs-table tr[data-job-id='{failed}'] a.job-link")
        wait.until(lambda d: text_of("#job-status") == "failed")
        assert "400" in text_of("#job-error")
        fixed.set()
        click("#job-retry")
        confirm()
        wait.until(lambda d: text_of("#job-status") == "completed")
        wait.until(lambda d: (d.find_element(By.ID, "img-result").get_attribute("src") or "").startswith("blob:"))
        shot("job")
        assert job_status(failed) == "completed"
        print("console-check: the failed job was found by filter, retried, and completed")

        step = "pause a provider; a job waits; resume"
        go("#/providers", "#providers-table tr[data-provider='remote']")
        click("#providers-table tr[data-provider='remote'] button.pause")
        confirm()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#providers-table tr[data-provider='remote'] button.resume"))
        waiting = create_job()

        def queued_while_paused():
            status, overview = rest("GET", "/admin/v1/overview", headers=admin_headers)
            assert status == 200, (status, overview)
            remote = next(p for p in overview["providers"] if p["provider"] == "remote")
            return remote["paused"] and remote["queued"] == 1

        wait_for(queued_while_paused, "the new job to wait queued")
        wait.until(lambda d: text_of("#providers-table tr[data-provider='remote'] td:nth-child(2)") == "1")
        assert job_status(waiting) == "queued"
        shot("providers")
        click("#providers-table tr[data-provider='remote'] button.resume")
        wait_for(lambda: job_status(waiting) == "completed", "the waiting job to complete once resumed")
        print("console-check: a paused provider's job waited queued and completed once resumed")

        step = "workers"
        go("#/workers", "#workers-table tbody tr")
        shot("workers")

        step = "grant credits"
        before = remaining_today()
        go("#/users", "#user-search")
        find("#user-search").send_keys(device)
        click("#user-search-button")
        wait.until(lambda d: text_of("#user-daily-remaining") == str(before))
        find("#grant-credits").send_keys("5")
        find("#grant-reason").send_keys("two failed edits, console check")
        click("#grant-button")
        confirm()
        wait.until(lambda d: text_of("#user-daily-remaining") == str(before + 5))
        assert remaining_today() == before + 5, "users/me shows the grant"
        shot("user")
        print(f"console-check: granted 5 credits; users/me went from {before} to {before + 5} left today")

        step = "audit log"
        go("#/audit", "#audit-table tbody tr")
        actions = [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, "#audit-table tbody tr td:nth-child(3)")]
        for expected in ("users.grant", "dispatch.resume", "dispatch.pause", "jobs.retry"):
            assert expected in actions, (expected, actions)
        shot("audit")

        step = "a phone's screen"
        driver.set_window_size(390, 844)
        for page, selector in (("#/", "#effects-table"), ("#/jobs", "#jobs-table"), (f"#/user/{user_id}", "#windows-table")):
            go(page, selector)
            overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"{page} is {overflow}px wider than a phone's screen"
        go("#/", "#effects-table")
        shot("phone-queue")
        driver.set_window_size(1280, 900)
        print("console-check: every page fits a phone's width")

        step = "no secret in the page"
        source = driver.page_source
        for secret in (args.admin_token, args.viewer_token, "sig=", "X-Amz-Signature"):
            assert secret not in source, f"the page holds {secret!r}"

        step = "the viewer reads and may not act"
        click("#logout")
        sign_in(args.viewer_token, "viewer")
        go("#/jobs?state=completed", "#jobs-table")
        assert not driver.find_elements(By.CSS_SELECTOR, "#retry-selected, #cancel-matching, .job-select")
        go(f"#/job/{failed}", "#job-status")
        assert not driver.find_elements(By.CSS_SELECTOR, "#job-retry, #job-cancel")
        go("#/providers", "#providers-table tbody tr")
        assert not driver.find_elements(By.CSS_SELECTOR, "main button"), [b.text for b in driver.find_elements(By.CSS_SELECTOR, "main button")]
        go(f"#/user/{user_id}", "#windows-table")
        assert not driver.find_elements(By.CSS_SELECTOR, "#grant-button, #plan-button")
        go("#/workers", "#workers-table tbody tr")
        assert not driver.find_elements(By.CSS_SELECTOR, "button.drain, button.undrain")
        status = driver.execute_async_script(
            """const done = arguments[arguments.length - 1];
            fetch('/admin/v1/jobs/retry', {method: 'POST', headers: {Authorization: 'Bearer ' + sessionStorage.getItem('photoedit-console-token'),
              'Content-Type': 'application/json'}, body: JSON.stringify({ids: [arguments[0]]})}).then(r => done(r.status), () => done(0));""", failed)
        assert status == 403, f"the viewer's POST answered {status}"
        print("console-check: the viewer sees no action button, and its POST is refused with 403")
    except Exception as error:
        shot("failure")
        print(f"console-check: FAILED at '{step}': {error!r}", file=sys.stderr)
        for entry in driver.get_log("browser")[-20:]:
            print(f"console-check: browser: {entry}", file=sys.stderr)
        driver.quit()
        model.shutdown()
        return 1
    driver.quit()
    model.shutdown()
    print(f"console-check: passed; screenshots in {shots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
