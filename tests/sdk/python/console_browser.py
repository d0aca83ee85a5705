"""The console in headless Chromium (Debian's, driven by Playwright).

Usage: console_browser.py BASE_URL EMAIL PASSWORD ADMIN_KEY PROJECT_TOKEN INVITE_LINK ARTIFACT_DIR

The admin signs in, finds a flag, changes its rollout, sees the diff in its history, reverts
it (checking /flags after each), searches an endpoint's logs and watches a run appear in the
live tail; every page is visited and screenshotted. An invited member joins through the
invite link, reads what a member may and is refused the team page; once deactivated, their
session stops. Pages are read with JavaScript off too. Prints one JSON line of findings.
"""

import json
import os
import sys
import urllib.request

from playwright.sync_api import sync_playwright

import chromium

base, email, password, admin_key, token, invite_link, artifacts = sys.argv[1:8]
result = {"console_errors": [], "statuses": {}}


def api(method, path, body=None, key=admin_key):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req) as res:
            text = res.read()
            return res.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as err:
        return err.code, None


def flag_enabled():
    _, body = api("POST", "/flags?v=2", {"token": token, "distinct_id": "someone"}, key=None)
    return body["flags"]["console-flag"]["enabled"]


def watch(page, who):
    def on_console(msg):
        if msg.type == "error":
            result["console_errors"].append(f"{who}: {msg.text} ({msg.location.get('url')})")

    page.on("console", on_console)
    page.on("pageerror", lambda err: result["console_errors"].append(f"{who}: {err}"))


def shot(page, name):
    page.screenshot(path=os.path.join(artifacts, f"console-{name}.png"), full_page=True)


def visit(page, path, name):
    response = page.goto(base + path)
    result["statuses"][name] = response.status
    shot(page, name)
    return response


with sync_playwright() as p:
    browser = chromium.launch(p)
    admin = browser.new_page()
    watch(admin, "admin")

    # Signing in from the console comes back to it.
    admin.goto(base + "/console")
    result["login_redirect"] = "/login" in admin.url
    admin.fill("#email", email)
    admin.fill("#password", password)
    admin.click("button[type=submit]")
    admin.wait_for_url(base + "/console")
    shot(admin, "overview")
    result["statuses"]["overview"] = 200

    # Find the flag, change its rollout, see the diff, revert.
    visit(admin, "/console/projects/1/flags", "flags")
    admin.fill("#q", "console")
    admin.click("form.row button[type=submit]")
    admin.click("text=console-flag")
    admin.wait_for_selector("#conditions")
    result["enabled_before"] = flag_enabled()
    admin.fill("input[name=rollout_percentage]", "100")
    admin.click("#conditions button[type=submit]")
    admin.wait_for_selector("#notice")
    result["rollout_notice"] = admin.inner_text("#notice")
    result["rollout_cell"] = admin.inner_text("#conditions td.rollout")
    first = admin.locator("#history tbody tr").first
    result["history_first"] = first.inner_text()
    result["enabled_after_rollout"] = flag_enabled()
    shot(admin, "flag")
    first.locator("button", has_text="Revert").click()
    admin.wait_for_selector("#notice")
    result["revert_notice"] = admin.inner_text("#notice")
    result["enabled_after_revert"] = flag_enabled()
    admin.fill("#distinct_id", "someone")
    admin.click("button:has-text('Evaluate')")
    admin.wait_for_selector("#evaluation")
    result["evaluation"] = admin.inner_text("#evaluation")
    shot(admin, "flag-evaluated")

    # An endpoint's logs: search, then a run shows up in the live tail.
    visit(admin, "/console/projects/1/endpoints", "endpoints")
    visit(admin, "/console/projects/1/endpoints/counts", "endpoint")
    admin.fill("#search", "executed")
    admin.click("#log-search button[type=submit]")
    admin.wait_for_selector("#logs")
    result["log_rows"] = admin.locator("#logs tbody tr").count()
    # A selector, not a JavaScript predicate: the console's CSP forbids the eval that
    # Playwright's polling of a predicate string needs once the first check fails.
    admin.wait_for_selector("#tail-status:text-is('live')")
    status, _ = api("POST", "/api/projects/1/endpoints/counts/run", {})
    result["run_status"] = status
    admin.wait_for_selector("#tail tbody tr", timeout=15000)
    result["tailed"] = admin.inner_text("#tail tbody tr")
    shot(admin, "endpoint-tail")

    for path, name in [
        ("/console/projects/1/activity", "activity"),
        ("/console/projects/1/persons?distinct_id=someone", "persons"),
        ("/console/projects/1/events", "events"),
        ("/console/projects/1/webhooks", "webhooks"),
        ("/console/keys", "keys"),
        ("/console/team", "team"),
    ]:
        visit(admin, path, name)
    result["team_has_member_table"] = admin.locator("#members").count() == 1

    # Reading works with JavaScript off.
    quiet = browser.new_context(java_script_enabled=False)
    quiet.add_cookies(admin.context.cookies())
    no_js = quiet.new_page()
    response = no_js.goto(base + "/console/projects/1/flags")
    result["no_js_flags"] = [response.status, no_js.locator("#flags tbody tr").count()]
    response = no_js.goto(base + "/console/projects/1/endpoints/counts")
    result["no_js_endpoint"] = [response.status, no_js.locator("#versions tbody tr").count()]
    quiet.close()

    # The invited member joins, reads, and is refused the team page.
    member_context = browser.new_context()
    member = member_context.new_page()
    watch(member, "member")
    member.goto(invite_link)
    member.fill("#password", "member-password-1")
    member.click("button[type=submit]")
    member.wait_for_url(base + "/console")
    result["member_flags"] = member.goto(base + "/console/projects/1/flags").status
    shot(member, "member-flags")
    before = len(result["console_errors"])
    result["member_team"] = member.goto(base + "/console/team").status
    # The refusal itself is the one expected error: the page's own 403.
    result["console_errors"][before:] = [
        e for e in result["console_errors"][before:] if "status of 403" not in e
    ]
    result["member_team_text"] = member.inner_text("h1")
    shot(member, "member-refused")

    # Deactivated by the admin: the member's session stops at once.
    _, members = api("GET", "/api/organizations/@current/members/")
    uuid = next(m["id"] for m in members["results"] if m["user"]["email"] == "member@example.com")
    result["deactivate_status"] = api("DELETE", f"/api/organizations/@current/members/{uuid}/")[0]
    member.goto(base + "/console/projects/1/flags")
    result["member_after_deactivation_url"] = member.url
    browser.close()

print(json.dumps(result))
