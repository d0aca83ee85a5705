"""The MCP Python SDK's OAuth client (CIMD mode) against Corvid.

Usage: oauth_mcp.py BASE_URL CLIENT_METADATA_URL EMAIL PASSWORD
The SDK's own OAuthClientProvider discovers Corvid from a 401, uses the client metadata URL as
its client_id, runs PKCE and exchanges the code; the "user" (redirect_handler) signs in and
approves with plain HTTP requests. Prints one JSON line with the protected call's result.
"""

import asyncio
import html
import json
import re
import sys
import urllib.parse

import httpx
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

base, metadata_url, email, password = sys.argv[1:5]


class MemoryStorage(TokenStorage):
    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def hidden(page: str) -> dict:
    return {
        html.unescape(k): html.unescape(v)
        for k, v in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', page)
    }


captured = {}


async def redirect_handler(authorization_url: str) -> None:
    async with httpx.AsyncClient(follow_redirects=False, timeout=30) as user:
        r = await user.get(authorization_url)
        assert r.status_code == 303, (r.status_code, r.text)
        login = await user.get(base + r.headers["location"])
        form = hidden(login.text)
        form.update(email=email, password=password)
        r = await user.post(base + "/login", data=form)
        assert r.status_code == 303, (r.status_code, r.text)
        consent = await user.get(base + r.headers["location"])
        assert consent.status_code == 200, (consent.status_code, consent.text)
        form = hidden(consent.text)
        form["decision"] = "approve"
        r = await user.post(base + "/oauth/authorize", data=form)
        assert r.status_code == 303, (r.status_code, r.text)
        query = urllib.parse.parse_qs(urllib.parse.urlparse(r.headers["location"]).query)
        captured["code"] = query["code"][0]
        captured["state"] = query.get("state", [None])[0]


async def callback_handler():
    return captured["code"], captured["state"]


async def main():
    storage = MemoryStorage()
    provider = OAuthClientProvider(
        server_url=base + "/api/users/@me/",
        client_metadata=OAuthClientMetadata(
            redirect_uris=["http://127.0.0.1:33418/callback"],
            client_name="MCP test client",
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
        client_metadata_url=metadata_url,
    )
    async with httpx.AsyncClient(auth=provider, timeout=30) as client:
        r = await client.get(base + "/api/users/@me/")
    print(
        json.dumps(
            {
                "status": r.status_code,
                "email": r.json().get("email") if r.status_code == 200 else None,
                "access_token_prefix": storage.tokens.access_token[:4] if storage.tokens else None,
                "client_id": storage.client.client_id if storage.client else None,
            }
        )
    )


asyncio.run(main())
