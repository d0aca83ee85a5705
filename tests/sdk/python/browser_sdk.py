"""posthog-js (the npm package's browser bundle) on a web page in headless Chromium, with
`api_host` pointed at Corvid. The page is served from another origin (its own loopback port),
so every SDK request is a real cross-origin request.

Usage: browser_sdk.py CORVID_URL PROJECT_TOKEN POSTHOG_JS_BUNDLE
Prints one JSON object: what the page saw (flags, payloads, early-access features, surveys),
plus every failed request, every 4xx/5xx answer and every console error.
"""

import gzip
import http.server
import json
import sys
import threading

from playwright.sync_api import sync_playwright

import chromium

corvid, token, bundle = sys.argv[1:4]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>shop</title></head>
<body><h1>Shop</h1>
<script src="/posthog.js"></script>
<script>
  window.corvidReady = new Promise((resolve) => {
    posthog.init(%(token)s, {
      api_host: %(host)s,
      opt_out_useragent_filter: true,
      persistence: 'localStorage',
      request_batching: false,
      loaded: () => resolve(true),
    });
  });
</script>
</body></html>
"""


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/posthog.js"):
            with open(bundle, "rb") as f:
                body, kind = f.read(), "application/javascript"
        else:
            body = (PAGE % {"token": json.dumps(token), "host": json.dumps(corvid)}).encode()
            kind = "text/html"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=site.serve_forever, daemon=True).start()
page_url = f"http://127.0.0.1:{site.server_port}/"

SCENARIO = """
async () => {
  await window.corvidReady;
  const flagsLoaded = new Promise((resolve) => posthog.onFeatureFlags(() => resolve(true)));
  await flagsLoaded;
  const out = {};
  out.bool = posthog.isFeatureEnabled('bool-flag');
  out.variant = posthog.getFeatureFlag('multi-flag');
  out.payload = posthog.getFeatureFlagPayload('payload-flag');
  out.allFlags = posthog.featureFlags.getFlags();

  posthog.capture('custom_event', { plan: 'pro', cart: 3 });
  posthog.identify('browser-user', { email: 'browser@example.com' });
  posthog.group('company', 'acme-browser', { name: 'Acme Browser' });

  // Early access: list, enroll, and the server agrees after a reload.
  out.earlyAccess = await new Promise((resolve) =>
    posthog.getEarlyAccessFeatures((features) => resolve(features), true));
  out.enabledBeforeEnrollment = posthog.isFeatureEnabled('beta-feature');
  posthog.updateEarlyAccessFeatureEnrollment('beta-feature', true);
  out.enabledAfterEnrollment = posthog.isFeatureEnabled('beta-feature');
  return out;
}
"""

# Surveys: fetched, and active for this person (its targeting flag comes from /flags).
SURVEYS = """
async () => {
  const out = {};
  out.enabledAfterReload = posthog.isFeatureEnabled('beta-feature');
  // Surveys: fetched, and active for this person (its targeting flag comes from /flags).
  out.surveys = await new Promise((resolve) => posthog.getSurveys((s) => resolve(s), true));
  out.activeSurveys = await new Promise((resolve) =>
    posthog.getActiveMatchingSurveys((s) => resolve(s), true));
  out.config = window._POSTHOG_REMOTE_CONFIG ? window._POSTHOG_REMOTE_CONFIG[%(token)s] : null;
  return out;
}
""" % {"token": json.dumps(token)}



def request_text(request):
    """A request body as text (the SDK gzips flags bodies when remote config allows it)."""
    body = request.post_data_buffer or b""
    if body[:2] == b"\x1f\x8b":
        body = gzip.decompress(body)
    return body.decode("utf-8", "replace")


problems = []
with sync_playwright() as p:
    browser = chromium.launch(p)
    page = browser.new_page()
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.method} {r.url} {r.failure}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.request.method} {r.url}") if r.status >= 400 else None)
    requests = []
    page.on("request", lambda r: requests.append(f"{r.method} {r.url}") if r.url.startswith(corvid) else None)
    page.goto(page_url)
    result = page.evaluate(SCENARIO)
    # The next flags request carries the enrollment (an override the SDK keeps); the server's
    # own answer to it must agree.
    with page.expect_response(
        lambda r: "/flags" in r.url and "$feature_enrollment/beta-feature" in request_text(r.request)
    ) as answer:
        page.evaluate("posthog.reloadFeatureFlags()")
    result["serverSaysEnrolled"] = answer.value.json()["flags"]["beta-feature"]["enabled"]
    result.update(page.evaluate(SURVEYS))
    # Let the last events leave the page before it closes.
    page.wait_for_load_state("networkidle")
    browser.close()
site.shutdown()
result["problems"] = problems
result["requests"] = requests
print(json.dumps(result))
