"""Setup for oauth.sh: hosts the bench client's metadata document, signs in as the bootstrap
admin and runs N authorization-code flows (PKCE), writing N refresh tokens and one access token.

Usage: oauth_setup.py BASE CIMD_PORT DOCS_DIR PASSWORD N OUT_DIR
"""

import base64
import hashlib
import html
import http.cookiejar
import json
import os
import re
import sys
import urllib.parse
import urllib.request

base, cimd_port, docs, password, n, out = sys.argv[1:7]
client_id = f"https://localhost:{cimd_port}/bench-client.json"
redirect = "http://127.0.0.1:9/callback"
with open(os.path.join(docs, "bench-client.json"), "w") as f:
    json.dump({"client_id": client_id, "client_name": "Bench", "redirect_uris": ["http://127.0.0.1/callback"]}, f)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


jar = http.cookiejar.CookieJar()
opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), NoRedirect)


def call(url, data=None):
    try:
        r = opener.open(url, data=urllib.parse.urlencode(data).encode() if data else None)
        return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def hidden(page):
    return {html.unescape(k): html.unescape(v) for k, v in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', page)}


_, _, page = call(base + "/login")
form = hidden(page)
form.update(email="admin@localhost", password=password)
status, _, _ = call(base + "/login", form)
assert status == 303, status

refresh, access = [], None
for _ in range(int(n)):
    verifier = base64.urlsafe_b64encode(os.urandom(48)).rstrip(b"=").decode()
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    q = urllib.parse.urlencode({"response_type": "code", "client_id": client_id, "redirect_uri": redirect,
                                "scope": "user:read", "code_challenge": challenge, "code_challenge_method": "S256"})
    status, _, page = call(base + "/oauth/authorize?" + q)
    assert status == 200, (status, page)
    form = hidden(page)
    form["decision"] = "approve"
    status, headers, _ = call(base + "/oauth/authorize", form)
    assert status == 303, status
    code = urllib.parse.parse_qs(urllib.parse.urlparse(headers["Location"]).query)["code"][0]
    status, _, body = call(base + "/oauth/token", {"grant_type": "authorization_code", "code": code, "client_id": client_id,
                                                   "redirect_uri": redirect, "code_verifier": verifier})
    assert status == 200, (status, body)
    tokens = json.loads(body)
    refresh.append(tokens["refresh_token"])
    access = tokens["access_token"]
with open(os.path.join(out, "refresh_tokens.txt"), "w") as f:
    f.write("\n".join(refresh) + "\n")
with open(os.path.join(out, "access_token.txt"), "w") as f:
    f.write(access)
print(f"{len(refresh)} grants ready")
