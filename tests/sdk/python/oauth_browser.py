"""Headless Chromium (Debian's, driven by Playwright) through sign-in and consent.

Usage: oauth_browser.py BASE_URL CLIENT_ID EMAIL PASSWORD SCREENSHOT_PATH
Saves a screenshot of the consent screen, approves, catches the redirect to the client's
loopback callback, exchanges the code and calls the API with the token. Prints one JSON line.
"""

import base64
import hashlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

from playwright.sync_api import sync_playwright

import chromium

base, client_id, email, password, screenshot = sys.argv[1:6]
redirect = "http://127.0.0.1:45123/callback"
verifier = base64.urlsafe_b64encode(os.urandom(48)).rstrip(b"=").decode()
challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
query = urllib.parse.urlencode(
    {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect,
        "scope": "user:read",
        "state": "browser-state",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
)
result = {}
with sync_playwright() as p:
    browser = chromium.launch(p)
    page = browser.new_page()
    callback = {}

    def on_callback(route):
        callback["url"] = route.request.url
        route.fulfill(status=200, content_type="text/plain", body="signed in")

    page.route("http://127.0.0.1:45123/**", on_callback)
    page.goto(base + "/oauth/authorize?" + query)
    page.fill("#email", email)
    page.fill("#password", password)
    page.click("button[type=submit]")
    page.wait_for_selector("button[value=approve]")
    result["consent_title"] = page.inner_text("h1")
    result["shows_unverified"] = "Unverified application" in page.content()
    page.screenshot(path=screenshot, full_page=True)
    page.click("button[value=approve]")
    page.wait_for_url(redirect + "*")
    browser.close()

params = urllib.parse.parse_qs(urllib.parse.urlparse(callback["url"]).query)
result["state"] = params["state"][0]
body = urllib.parse.urlencode(
    {
        "grant_type": "authorization_code",
        "code": params["code"][0],
        "client_id": client_id,
        "redirect_uri": redirect,
        "code_verifier": verifier,
    }
).encode()
with urllib.request.urlopen(urllib.request.Request(base + "/oauth/token", data=body)) as r:
    result["token_status"] = r.status
    token = json.load(r)["access_token"]
req = urllib.request.Request(base + "/api/users/@me/", headers={"Authorization": "Bearer " + token})
with urllib.request.urlopen(req) as r:
    result["me_status"] = r.status
print(json.dumps(result))
